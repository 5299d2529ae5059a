"""`berth serve --processes N`: N server processes on one port and one database.

The parent serves nothing itself: it reserves the port (SO_REUSEPORT, so that `--listen
HOST:0` names one port for all), starts the first server and waits for it to answer `/readyz`
(it migrates an embedded Postgres, mints the first admin token, writes `server.url` and runs the
built-in worker), then starts the others, each binding the same port with SO_REUSEPORT: the
kernel spreads connections (HTTP requests and worker sockets) over them. Each is an ordinary
server on the shared database (operations.md, "Several servers on one database"): it
dispatches to the workers attached to it and wakes the others through NOTIFY.

/metrics: a scrape reaches one process, so its counters are that process's alone. A whole view
per `serve` needs the processes to share them: prometheus_client's multiprocess mode
(PROMETHEUS_MULTIPROC_DIR set here per group, emptied at start, `mark_process_dead` when a
server exits, and the route collecting with MultiProcessCollector besides the Postgres gauges).

SIGTERM/SIGINT to the parent reach every server; when one server exits on its own, the parent
stops the others and exits with that server's code, so a supervisor above (systemd, --detach's
--stop) sees one service.
"""

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import httpx

from service.cli.client import CliError
from service.core.exits import Exit

READY_WAIT = 120.0  # seconds the first server has to answer /readyz (it may migrate)
STOP_WAIT = 60.0  # seconds each server has to stop after TERM


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port with SO_REUSEPORT (every server of the group sets it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def supervise(  # noqa: PLR0917  (the serve command's parsed options, passed on once)
    n: int,
    host: str,
    port: int,
    scheme: str,
    config: Path | None,
    log_level: str,
    log_format: str | None,
    builtin_worker: bool,
) -> int:
    """Run n servers on host:port until TERM/INT or until one of them exits."""
    # Bound, never listening: it only holds the port (and picks it for port 0) so that every
    # server binds the same one; the kernel hands connections to listening sockets alone.
    holder = reuse_port_socket(host, port)
    port = holder.getsockname()[1]
    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    base = [sys.executable, "-m", "service", "serve", "--listen", listen, "--reuse-port"]
    if config:
        base += ["--config", str(config)]
    base += ["--log-level", log_level]
    if log_format:
        base += ["--log-format", log_format]
    stopping = False

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    def stop() -> bool:
        return stopping

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(n):
            # One built-in worker per `berth serve`, not per process: the first one's.
            argv = base if i == 0 and builtin_worker else [*base, "--no-builtin-worker"]
            # The others follow only once the first answers: it alone migrates an embedded
            # Postgres and mints the first admin token, so they never race on a fresh database.
            argv = argv if i == 0 else [*argv, "--secondary"]
            procs.append(subprocess.Popen(argv))
            if i == 0 and not _wait_ready(procs[0], f"{scheme}://{_dial(host)}:{port}", stop):
                break
        code = _watch(procs, stop)
    finally:
        _stop_all(procs)
        holder.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


def _dial(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):  # noqa: S104  (what to dial when listening everywhere)
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _wait_ready(proc: "subprocess.Popen[bytes]", url: str, stopping: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + READY_WAIT
    while time.monotonic() < deadline and not stopping():
        if proc.poll() is not None:
            return False
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=1, verify=False).status_code == 200:  # noqa: S501
                return True
        time.sleep(0.2)
    if stopping():
        return False
    raise CliError(f"the first server did not become ready in {READY_WAIT:g}s", Exit.SERVER_ERROR)


def _watch(procs: "list[subprocess.Popen[bytes]]", stopping: Callable[[], bool]) -> int:
    """Wait until asked to stop (0) or until a server exits (its code, 1 for a clean exit)."""
    while not stopping():
        for proc in procs:
            code = proc.poll()
            if code is not None:
                print(
                    f"berth: server process {proc.pid} exited with {code}; stopping the others",
                    file=sys.stderr,
                )
                return code or int(Exit.SERVER_ERROR)
        time.sleep(0.2)
    return 0


def _stop_all(procs: "list[subprocess.Popen[bytes]]") -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_WAIT
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
