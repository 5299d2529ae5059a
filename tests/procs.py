"""Real `berth serve` and `berth worker` processes for end-to-end tests, on loopback.

Also the process harness the benchmark shares (`bench/berth/common.py` imports it): a free
port, a config merge, berth's command lines and environment, and the wait for a server's
`/readyz`. Those pieces stay small and free of test fixtures for that reason.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
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


def berth_argv(*args: str) -> list[str]:
    """berth's command line under this interpreter: `python -m service ARGS`."""
    return [sys.executable, "-m", "service", *args]


def serve_argv(port: int, *, builtin_worker: bool = True, args: Sequence[str] = ()) -> list[str]:
    """`berth serve` on loopback at `port`, then `args`."""
    argv = berth_argv("serve", "--listen", f"127.0.0.1:{port}")
    if not builtin_worker:
        argv.append("--no-builtin-worker")
    return [*argv, *args]


def berth_env(
    *, home: Path, server: str, config: dict[str, Any], db_url: str | None, **extra: str
) -> dict[str, str]:
    """The environment of a berth process: this one's without any BERTH_* setting (a caller's
    token, server or config must not leak in), then the given home, server, config and
    database, then `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    env.update(
        BERTH_HOME=str(home),
        BERTH_SERVER=server,
        BERTH_CONFIG_JSON=json.dumps(config),
        PYTHONUNBUFFERED="1",
    )
    if db_url:
        env["BERTH_DATABASE_URL"] = db_url
    env.update(extra)
    return env


def wait_ready(
    proc: subprocess.Popen[Any],
    url: str,
    timeout: float,
    log: Callable[[], str],
    *,
    verify: Any = True,
    every: float = 0.1,
) -> None:
    """Poll `url`/readyz until it answers 200; RuntimeError with `log()` when `proc` exits
    first or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"berth serve exited {proc.returncode}:\n{log()}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1, verify=verify).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(every)
    raise RuntimeError(f"berth serve not ready after {timeout:.0f} s:\n{log()}")


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
        return berth_env(
            home=self.home,
            server=self.url,
            config=merge(FAST, self.config),
            db_url=self.db_url,
            **{**self.extra_env, **extra},
        )

    def start(self, timeout: float = 60) -> "Server":
        self.home.mkdir(parents=True, exist_ok=True)
        argv = serve_argv(self.port, builtin_worker=self.builtin_worker, args=self.args)
        log = (self.home / "serve.log").open("ab")
        self.proc = subprocess.Popen(argv, env=self.env(), stdout=log, stderr=log)
        wait_ready(self.proc, self.url, timeout, self.log, verify=self.verify)
        return self

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
            berth_argv(*args),
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
        argv = [*self.prefix, *berth_argv("worker", "--server", self.server.url)]
        argv += ["--pool", self.pool, *self.args]
        env = self.server.env(BERTH_TOKEN=self.token, BERTH_HOME=str(self.home), **self.extra_env)
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        return self

    def start_with(self, env: dict[str, str]) -> "Worker":
        """Start with these credentials in the environment and no --pool unless one is set."""
        self.home.mkdir(parents=True, exist_ok=True)
        argv = berth_argv("worker", "--server", self.server.url)
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
