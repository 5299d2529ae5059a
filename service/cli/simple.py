"""`berth pool list` and `berth status`."""

import argparse
from typing import Any

from service.cli.client import Client, add_server_arg, listing, print_json


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser("pool", help="pools and their slots")
    psub = p.add_subparsers(dest="pool_command", required=True, parser_class=type(p))
    ls = psub.add_parser("list", help="list pools")
    add_server_arg(ls)
    ls.set_defaults(func=pool_list)
    st = sub.add_parser("status", help="server, pools, queue depth, limits")
    add_server_arg(st)
    st.set_defaults(func=status)


def pool_list(args: argparse.Namespace) -> int:
    pools = Client(args.server).call("GET", "/api/v1/pools")
    return listing(
        args,
        pools,
        [
            [
                p["name"],
                " ".join(f"{k}={v}" for k, v in p["slots"].items()),
                str(p["workers"]),
                f"{p['max_load']:g}",
                f"{p['min_memory_gb']:g}",
                f"{p['min_disk_gb']:g}",
            ]
            for p in pools
        ],
        ["POOL", "SLOTS", "WORKERS", "MAX_LOAD", "MIN_MEM_GB", "MIN_DISK_GB"],
    )


def status(args: argparse.Namespace) -> int:
    client = Client(args.server)
    st = client.call("GET", "/api/v1/status")
    if args.json:
        print_json(st)
        return 0
    print(f"server   {client.server} (berth {st['server']['version']})")
    print(f"running  {st['running']} job(s)")
    for name, p in sorted(st["pools"].items()):
        slots = " ".join(f"{k}={v}" for k, v in p["slots"].items())
        print(f"pool     {name}: {p['workers']} worker(s) attached, slots {slots}")
    for q in st["queued"]:
        print(f"queued   {q['jobs']} {q['kind']} job(s) for {q['pool'] or 'any pool'}")
    if not st["queued"]:
        print("queued   none")
    for lim in st["limits"]:
        print(f"limit    {lim['key']}={lim['value']} ({lim['reason']})")
    return 0
