"""Real `berth serve` and `berth worker` processes for end-to-end tests, on loopback."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

FAST = {
    "executor": {
        "heartbeat_seconds": 0.5,
        "unreachable_seconds": 2.0,
        "evict_seconds": 3.0,
        "kill_grace_seconds": 0.5,
        "loop_seconds": 0.25,
    }
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@dataclass
class Result:
    code: int
    out: str
    err: str


@dataclass
class Server:
    home: Path
    db_url: str | None
    config: dict[str, Any] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    builtin_worker: bool = True
    proc: subprocess.Popen[bytes] | None = None
    scheme: str = "http"
    extra_env: dict[str, str] = field(default_factory=dict)  # for the server, its CLI and workers
    verify: Any = True  # what the test's own HTTP client trusts (an SSLContext for a private CA)
    args: Sequence[str] = ()  # more `berth serve` arguments

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
        env.update(
            BERTH_HOME=str(self.home),
            BERTH_SERVER=self.url,
            BERTH_CONFIG_JSON=json.dumps(merge(FAST, self.config)),
            PYTHONUNBUFFERED="1",
        )
        if self.db_url:
            env["BERTH_DATABASE_URL"] = self.db_url
        env.update(self.extra_env)
        env.update(extra)
        return env

    def start(self, timeout: float = 60) -> "Server":
        self.home.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "service", "serve", "--listen", f"127.0.0.1:{self.port}"]
        if not self.builtin_worker:
            argv.append("--no-builtin-worker")
        argv += list(self.args)
        log = (self.home / "serve.log").open("ab")
        self.proc = subprocess.Popen(argv, env=self.env(), stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"berth serve exited {self.proc.returncode}:\n{self.log()}")
            try:
                if (
                    httpx.get(f"{self.url}/readyz", timeout=1, verify=self.verify).status_code
                    == 200
                ):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"berth serve not ready:\n{self.log()}")

    def log(self) -> str:
        path = self.home / "serve.log"
        return path.read_text(errors="replace")[-6000:] if path.exists() else ""

    @property
    def token(self) -> str:
        return (self.home / "admin.token").read_text().strip()

    def cli(
        self,
        *args: str,
        token: str | None = None,
        timeout: float = 60,
        stdin: str | None = None,
        **env: str,
    ) -> Result:
        extra = dict(env)
        extra["BERTH_TOKEN"] = token or self.token
        r = subprocess.run(
            [sys.executable, "-m", "service", *args],
            env=self.env(**extra),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
        return Result(r.returncode, r.stdout, r.stderr)

    def api(self, method: str, path: str, token: str | None = None, **kw: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.token}", **kw.pop("headers", {})}
        return httpx.request(
            method, f"{self.url}{path}", headers=headers, timeout=30, verify=self.verify, **kw
        )

    def worker_token(self, name: str) -> str:
        r = self.cli("token", "create", name, "--kind", "worker")
        assert r.code == 0, r.err
        return r.out.strip()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        kill(self.proc, sig)

    def stop(self) -> None:
        stop(self.proc)


@dataclass
class Worker:
    server: Server
    token: str
    pool: str
    home: Path
    args: Sequence[str] = ()
    proc: subprocess.Popen[str] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    prefix: Sequence[str] = ()  # runs the worker under this command (e.g. setpriv ...)

    def start(self) -> "Worker":
        self.home.mkdir(parents=True, exist_ok=True)
        argv = [
            *self.prefix,
            sys.executable,
            "-m",
            "service",
            "worker",
            "--server",
            self.server.url,
        ]
        argv += ["--pool", self.pool, *self.args]
        env = self.server.env(BERTH_TOKEN=self.token, BERTH_HOME=str(self.home), **self.extra_env)
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        return self

    def start_with(self, env: dict[str, str]) -> "Worker":
        """Start with these credentials in the environment and no --pool unless one is set."""
        self.home.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "service", "worker", "--server", self.server.url]
        if self.pool:
            argv += ["--pool", self.pool]
        argv += list(self.args)
        full = self.server.env(BERTH_HOME=str(self.home), **env)
        self.proc = subprocess.Popen(
            argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        return self

    def wait(self, timeout: float) -> Result:
        assert self.proc is not None
        out, err = self.proc.communicate(timeout=timeout)
        return Result(self.proc.returncode, out, err)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        kill(self.proc, sig)

    def stop(self) -> None:
        stop(self.proc)


def kill(proc: subprocess.Popen[Any] | None, sig: int = signal.SIGKILL) -> None:
    if proc and proc.poll() is None:
        proc.send_signal(sig)
        proc.wait(timeout=30)


def stop(proc: subprocess.Popen[Any] | None) -> None:
    """TERM, and KILL when it has not ended in 20 s."""
    if proc and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for(predicate: Any, timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def provisioned_workers(under: Path) -> list[Any]:
    """Live `berth worker` processes a provisioning server under `under` started (by their
    --provisioned marker and their state directory)."""
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if "--provisioned" not in p.cmdline() or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get("BERTH_HOME", "").startswith(str(under)):
                found.append(p)
        except psutil.Error:
            pass
    # A worker starting a job forks: until the child execs it shows the worker's own command
    # line and environment, so a match whose parent also matched is that child, not a worker.
    pids = {p.pid for p in found}
    alive = []
    for p in found:
        try:
            if p.ppid() not in pids:
                alive.append(p)
        except psutil.Error:
            pass
    return alive
