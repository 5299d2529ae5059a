"""`berth serve`: the API, the worker endpoint, the leader's loops and the built-in worker.

With no database URL it starts the embedded Postgres under $BERTH_HOME/postgres, migrates it,
and stops it on shutdown. With a URL it refuses an unmigrated database (`berth db upgrade`).
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from service.cli.client import CliError
from service.cli.logflags import add_log_args, log_json
from service.core.exits import Exit


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser("serve", help="run the server")
    p.add_argument("--home", type=Path, help="berth's home (env BERTH_HOME, default ~/.berth)")
    p.add_argument("--listen", help="HOST:PORT (default from config: 127.0.0.1:8443)")
    p.add_argument("--config", type=Path, help="config file (default $BERTH_HOME/berth.toml)")
    p.add_argument("--detach", action="store_true", help="run in the background; log to serve.log")
    p.add_argument(
        "--stop",
        action="store_true",
        help="stop the server started with --detach on this home (its serve.pid), and wait for it",
    )
    p.add_argument(
        "--processes",
        type=_positive,
        default=1,
        metavar="N",
        help="server processes sharing the port and the database (default 1)",
    )
    p.add_argument("--no-builtin-worker", action="store_true", help=argparse.SUPPRESS)
    # set by --processes for the servers it starts: bind with SO_REUSEPORT; and, on all but the
    # first, leave server.url and the first admin token to the first
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--secondary", action="store_true", help=argparse.SUPPRESS)
    add_log_args(p)
    p.set_defaults(func=run)


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"takes a whole number of 1 or more, not {text!r}")
    return n


def run(args: argparse.Namespace) -> int:
    if args.home:
        os.environ["BERTH_HOME"] = str(args.home.expanduser().resolve())
    if args.stop:
        return _stop()
    from service import config as config_mod  # noqa: PLC0415  (server-side imports stay lazy)

    cfg = config_mod.load(args.config)
    listen = args.listen or cfg.network.listen
    host, port = config_mod.split_listen(listen)
    if not config_mod.is_loopback(host) and not cfg.network.tls:
        raise CliError(
            f"refusing to listen on {listen} without TLS: set [network] tls = "
            '{ cert = "...", key = "..." }, or tls = "proxy" when a proxy ends TLS; '
            "only a loopback address may go without"
        )
    if args.detach:
        return _detach(args, host, port, cfg)
    builtin = cfg.builtin_worker() and not args.no_builtin_worker
    if args.processes > 1:
        from service.cli import processes  # noqa: PLC0415

        scheme = "https" if cfg.network.tls and cfg.network.tls != "proxy" else "http"
        return processes.supervise(
            args.processes,
            host,
            port,
            scheme,
            args.config,
            args.log_level,
            args.log_format,
            builtin,
        )
    from service.cli import serve_process  # noqa: PLC0415

    return serve_process.main(
        cfg,
        host=host,
        port=port,
        builtin_worker=builtin,
        log_level=args.log_level,
        log_json=log_json(args),
        reuse_port=args.reuse_port,
        primary=not args.secondary,
    )


STOP_WAIT = 60.0  # seconds a stopping server has to finish (it drains its sockets and loops)


def _stop() -> int:
    """TERM the detached server of this home, wait until it is gone."""
    import psutil  # noqa: PLC0415

    from service.config import home  # noqa: PLC0415

    pid_file = home() / "serve.pid"
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        raise CliError(
            f"no server started with --detach on {home()} ({pid_file} is missing)", Exit.NOT_FOUND
        ) from None
    try:
        proc = psutil.Process(pid)
        # The pid may have been reused since: stop it only if it is a berth server still.
        ours = "serve" in proc.cmdline() and "service" in " ".join(proc.cmdline())
    except psutil.Error:
        ours = False
    if not ours:
        pid_file.unlink(missing_ok=True)
        raise CliError(f"the server of {home()} (pid {pid}) is not running", Exit.NOT_FOUND)
    proc.terminate()
    try:
        proc.wait(timeout=STOP_WAIT)
    except psutil.TimeoutExpired:
        raise CliError(
            f"berth serve (pid {pid}) did not stop within {STOP_WAIT:g}s", Exit.SERVER_ERROR
        ) from None
    pid_file.unlink(missing_ok=True)
    print(f"stopped berth serve (pid {pid})")
    return 0


def _detach(args: argparse.Namespace, host: str, port: int, cfg: Any) -> int:  # noqa: ANN401
    from service.config import home  # noqa: PLC0415

    berth_home = home()
    berth_home.mkdir(parents=True, exist_ok=True)
    log_path = berth_home / "serve.log"
    argv = [sys.executable, "-m", "service", "serve", "--listen", f"{host}:{port}"]
    if args.config:
        argv += ["--config", str(args.config)]
    argv += ["--log-level", args.log_level, "--processes", str(args.processes)]
    if args.log_format:
        argv += ["--log-format", args.log_format]
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
        )
    scheme = "https" if cfg.network.tls and cfg.network.tls != "proxy" else "http"
    url = f"{scheme}://{host}:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CliError(
                f"berth serve exited with {proc.returncode}; see {log_path}", Exit.SERVER_ERROR
            )
        try:
            if httpx.get(f"{url}/readyz", timeout=1, verify=False).status_code == 200:  # noqa: S501
                print(f"berth serve running (pid {proc.pid}) at {url}; log: {log_path}")
                (berth_home / "serve.pid").write_text(str(proc.pid))
                return 0
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise CliError(f"berth serve did not become ready in 120s; see {log_path}", Exit.SERVER_ERROR)
