"""`berth pool list`."""

import argparse
from typing import Any

from service import views
from service.cli.client import add_server_arg, connect, print_json, table
from service.cli.limits import limit_line


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser("pool", help="pools and their slots")
    psub = p.add_subparsers(dest="pool_command", required=True, parser_class=type(p))
    ls = psub.add_parser("list", help="list pools")
    add_server_arg(ls)
    ls.set_defaults(func=pool_list)


def pool_list(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        pools = client.pools()
    if args.json:
        print_json(pools)
        return 0
    rows = [
        [
            p.name,
            " ".join(f"{k}={_cell(p, f'slots.{k}', v)}" for k, v in p.slots.items()),
            str(p.workers),
            _cell(p, "max_load", p.max_load),
            _cell(p, "min_memory_gb", p.min_memory_gb),
            _cell(p, "min_disk_gb", p.min_disk_gb),
            f"{prov.provider} max={_cell(p, 'provisioner.max', prov.max)} "
            f"idle={_cell(p, 'provisioner.idle_seconds', prov.idle_seconds)}s "
            + " ".join(f"{k}={n}" for k, n in sorted(prov.workers.items()))
            if (prov := p.provisioner)
            else "-",
        ]
        for p in pools
    ]
    header = ["POOL", "SLOTS", "WORKERS", "MAX_LOAD", "MIN_MEM_GB", "MIN_DISK_GB", "PROVISIONER"]
    table(rows, header)
    for p in pools:
        if (prov := p.provisioner) and prov.last_error:
            print(
                f"pool {p.name}: {prov.failures} failed start(s), next try in "
                f"{prov.retry_in:g}s: {prov.last_error}"
            )
    set_here = [x for p in pools for x in p.limits]
    if set_here:
        print("\n* set by `berth limits`:")
        for x in set_here:
            print(limit_line(x))
    return 0


def _cell(pool: views.PoolView, key: str, value: float) -> str:
    """A pool's value in force, starred when a limit set it."""
    full = f"pools.{pool.name}.{key}"
    limited = any(x.key == full and x.in_force for x in pool.limits)
    return f"{value:g}" + ("*" if limited else "")
