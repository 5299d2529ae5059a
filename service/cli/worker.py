"""`berth worker` (run one) and `berth worker list | drain | disable | enable NAME`."""

import argparse
import asyncio
import logging
import os
import pwd
import sys
from pathlib import Path
from typing import Any

from service.cli.client import Client, CliError, add_server_arg, home, listing

WHO_RUNS_JOBS = """\
Who a job runs as: a worker started as root runs each job under a uid of its own from
--uid-range (default 61000-61999), in a working directory only that uid may enter, so a job
can read neither the worker's state nor another job's files or environment. --run-as USER
runs every job as one fixed user instead. A worker that is NOT root runs its jobs as its own
user: they can then read whatever that user can, the worker's state directory included. Jobs
get a clean environment (PATH, HOME, LANG, LC_*, TZ, TMPDIR, USER, SHELL, the names given with
--pass-env, then their own env and secrets), never the worker's own settings or credential.
"""


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser(
        "worker",
        help="run a worker, or list and steer workers",
        description="Run a worker (--pool), or list and steer workers.",
        epilog=WHO_RUNS_JOBS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_server_arg(p)
    p.add_argument("action", nargs="?", choices=["list", "drain", "disable", "enable"])
    p.add_argument("name", nargs="?", help="the worker, for drain/disable/enable")
    p.add_argument("--pool", help="the pool this worker serves (to run one)")
    p.add_argument(
        "--name",
        dest="worker_name",
        help="behind a proxy: this worker's name (with a token, the token's name is used)",
    )
    p.add_argument("--labels", default="", help="comma-separated: a,b,k=v")
    p.add_argument(
        "--parallel", type=int, default=0, help="most jobs at once (0: the pool's slots)"
    )
    p.add_argument("--python", default=sys.executable, help="interpreter for Python jobs")
    p.add_argument(
        "--pass-env",
        action="append",
        default=[],
        metavar="NAME",
        help="pass this variable of the worker's environment to jobs (never BERTH_*)",
    )
    who = p.add_mutually_exclusive_group()
    who.add_argument(
        "--uid-range", default="61000-61999", metavar="A-B", help="as root: a uid per job"
    )
    who.add_argument("--run-as", default="", metavar="USER", help="as root: every job as USER")
    p.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="where jobs' working directories go (default /var/tmp/berth-work as root)",
    )
    p.set_defaults(func=dispatch)


def dispatch(args: argparse.Namespace) -> int:
    if args.action is None:
        return run(args)
    if args.action == "list":
        return list_workers(args)
    if not args.name:
        raise CliError(f"berth worker {args.action} NAME: which worker?")
    out = Client(args.server).call("POST", f"/api/v1/workers/{args.name}/{args.action}")
    print(f"{out['name']}: {out['state']}")
    return 0


def run(args: argparse.Namespace) -> int:
    from service.worker import environment, hardening  # noqa: PLC0415  (keeps `list` light)
    from service.worker import main as worker_main  # noqa: PLC0415

    token = os.environ.get("BERTH_TOKEN", "").strip()
    if not token:
        raise CliError("set BERTH_TOKEN to this worker's token (berth token create NAME)")
    if not args.pool:
        raise CliError("--pool is required to run a worker")
    server = args.server or os.environ.get("BERTH_SERVER") or "http://127.0.0.1:8443"
    if args.parallel < 0:
        raise CliError("--parallel must be >= 0")
    if not Path(args.python).exists():
        raise CliError(f"--python {args.python}: no such interpreter")
    try:
        pass_env = environment.check_pass_env(args.pass_env)
    except environment.BadPassEnv as exc:
        raise CliError(str(exc)) from None
    uid_range = _uid_range(args.uid_range)
    if args.run_as:
        try:
            pwd.getpwnam(args.run_as)
        except KeyError:
            raise CliError(f"--run-as {args.run_as}: no such user") from None
    labels = tuple(sorted({x.strip() for x in args.labels.split(",") if x.strip()}))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    worker_home = home()
    worker_home.mkdir(parents=True, exist_ok=True)
    opts = worker_main.Options(
        server=server,
        token=token,
        pool=args.pool,
        home=worker_home,
        labels=labels,
        parallel=args.parallel,
        python=args.python,
        name=args.worker_name or "",
        pass_env=pass_env,
        uid_range=uid_range,
        run_as=args.run_as,
        work_dir=args.work_dir,
    )
    # Jobs may run as this user: they must not read this process's environment (its token).
    hardening.undumpable()
    try:
        return asyncio.run(worker_main.run(opts))
    except KeyboardInterrupt:
        return 130


def _uid_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    if not (sep and lo.isdigit() and hi.isdigit()) or not 0 < int(lo) <= int(hi) < 2**31:
        raise CliError(f"--uid-range {text!r} must be A-B with 0 < A <= B (e.g. 61000-61999)")
    return int(lo), int(hi)


def _gb(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}G"


def list_workers(args: argparse.Namespace) -> int:
    workers = Client(args.server).call("GET", "/api/v1/workers")
    rows = []
    for w in workers:
        load = "-" if w["load"] is None else f"{w['load']:.1f}/{w['cpus']}"
        slots = " ".join(f"{k}:{v['used']}/{v['total']}" for k, v in w["slots"].items()) or "-"
        rows.append(
            [
                w["name"],
                w["pool"],
                w["state"],
                f"{w['seen_seconds_ago']:.0f}s ago",
                load,
                _gb(w["free_memory_gb"]),
                _gb(w["free_disk_gb"]),
                slots,
                ",".join(w["labels"]) or "-",
                w["no_lease"],
            ]
        )
    header = ["NAME", "POOL", "STATE", "SEEN", "LOAD", "MEM", "DISK", "SLOTS", "LABELS", "NO LEASE"]
    return listing(args, workers, rows, header)
