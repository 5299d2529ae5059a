"""Ceiling: requests/s of a hello-world Litestar app under one server process.

Runs inside ``bench/.venvs/ceilings``. ``--server`` picks one of

* ``uvicorn``: uvicorn's defaults with ``uvicorn[standard]`` installed, i.e. uvloop + httptools;
* ``uvicorn-h11``: ``--http h11 --loop asyncio``, what a plain ``uvicorn`` dependency gets;
* ``granian``: granian's ASGI interface, one worker, default runtime threads.

The server runs as a single process in its own process group; load comes from a separate
process: ``wrk`` when installed (one thread, so server and load generator get a core each), else
this script re-executed with ``--role load``, a keep-alive asyncio client that is slower than wrk
and so only a lower bound (the result says which was used). A one-second warm-up precedes the
measured ``--seconds`` window. Prints one JSON object with req/s and wrk's latency percentiles.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import shutil
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import benchlib

HERE = Path(__file__).resolve().parent
SERVERS = ("uvicorn", "uvicorn-h11", "granian")
REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(server: str, port: int) -> list[str]:
    bindir = Path(sys.executable).parent
    if server == "granian":
        return [
            str(bindir / "granian"),
            "--interface",
            "asgi",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--log-level",
            "warning",
            "--no-access-log",
            "hello_app:app",
        ]
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "hello_app:app",
        "--app-dir",
        str(HERE),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    if server == "uvicorn-h11":
        cmd += ["--http", "h11", "--loop", "asyncio"]
    return cmd


def wait_http(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0) as conn:
                conn.sendall(REQUEST)
                if conn.recv(64).startswith(b"HTTP/1.1 200"):
                    return True
        except OSError:
            pass
        time.sleep(0.1)
    return False


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()  # type: ignore[union-attr]
    return round(float(value) * _UNITS[unit], 3)


def run_wrk(port: int, seconds: float, connections: int) -> dict[str, object]:
    url = f"http://127.0.0.1:{port}/"
    # Warm-up: lets the server and the app reach their steady state before counting.
    subprocess_run(["wrk", "-t1", f"-c{connections}", "-d1s", url], timeout=30)
    out = subprocess_run(
        ["wrk", "-t1", f"-c{connections}", f"-d{int(seconds)}s", "--latency", url],
        timeout=seconds + 30,
    )
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    result: dict[str, object] = {"req_per_s": round(rps, 1), "loadgen": "wrk"}
    for pct in ("50", "99"):
        found = re.search(rf"^\s+{pct}%\s+(\S+)", out, re.MULTILINE)
        if found:
            result[f"p{pct}_ms"] = _ms(found.group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", out)
    if errors:
        result["error"] = errors.group(0)
    return result


def subprocess_run(cmd: list[str], timeout: float) -> str:
    proc = benchlib.spawn(cmd, log_path=None, capture=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        benchlib.stop(proc, grace=1.0)
    return (out or b"").decode()


# ---------------------------------------------------------------------------------------------
# Fallback load generator (separate process, used only without wrk)


async def _client(port: int, stop_at: float, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.monotonic() < stop_at:
            writer.write(REQUEST)
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length:\s*(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
            counts[0] += 1
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def _load(port: int, seconds: float, connections: int) -> float:
    counts = [0]
    await asyncio.gather(*(_client(port, time.monotonic() + 1.0, [0]) for _ in range(connections)))
    t0 = time.monotonic()
    await asyncio.gather(*(_client(port, t0 + seconds, counts) for _ in range(connections)))
    return counts[0] / (time.monotonic() - t0)


def run_python_load(port: int, seconds: float, connections: int) -> dict[str, object]:
    out = subprocess_run(
        [
            sys.executable,
            __file__,
            "--role",
            "load",
            "--port",
            str(port),
            "--seconds",
            str(seconds),
            "--connections",
            str(connections),
        ],
        timeout=seconds + 30,
    )
    return {"req_per_s": round(float(out.strip().splitlines()[-1]), 1), "loadgen": "python"}


# ---------------------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> dict[str, object]:
    port = free_port()
    logs = benchlib.log_dir("hello")
    server = benchlib.spawn(
        server_command(args.server, port), log_path=logs / f"{args.server}.log", cwd=HERE
    )
    try:
        if not wait_http(port, 20.0):
            return {"error": f"{args.server} did not answer on port {port} within 20 s"}
        if shutil.which("wrk") and not args.python_load:
            result = run_wrk(port, args.seconds, args.connections)
        else:
            result = run_python_load(port, args.seconds, args.connections)
        if server.poll() is not None:
            result["error"] = f"server exited with {server.returncode} during the run"
        return result
    finally:
        benchlib.stop(server)


def main() -> int:
    p = argparse.ArgumentParser(description="hello-world Litestar req/s under one server")
    p.add_argument("--server", choices=SERVERS, default="uvicorn")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--python-load", action="store_true", help="use the asyncio load generator")
    p.add_argument("--timeout", type=float, default=100.0)
    p.add_argument("--role", choices=["bench", "load"], default="bench", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "load":
        print(asyncio.run(_load(args.port, args.seconds, args.connections)))
        return 0

    stub = {"system": args.server, "scenario": "hello"}
    benchlib.install_guards(args.timeout, stub)

    def go() -> int:
        result = {**stub, **measure(args), "seconds": args.seconds, "connections": args.connections}
        benchlib.emit(result)
        return 1 if "error" in result else 0

    return benchlib.main_guard(go, stub)


if __name__ == "__main__":
    sys.exit(main())
