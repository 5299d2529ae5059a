"""`berth worker` (run one) and `berth worker list | drain | disable | enable NAME`."""

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

from service.cli.client import Client, CliError, add_server_arg, home, listing


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser("worker", help="run a worker, or list and steer workers")
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
    from service.worker import main as worker_main  # noqa: PLC0415  (keeps `list` light)

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
    )
    try:
        return asyncio.run(worker_main.run(opts))
    except KeyboardInterrupt:
        return 130


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
