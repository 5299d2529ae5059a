"""`berth status`: the server, its pools, the queue and the limits set."""

import argparse
from typing import Any

from service.cli.client import add_server_arg, connect, print_json
from service.cli.limits import limit_line


def add(sub: Any) -> None:  # noqa: ANN401
    st = sub.add_parser("status", help="server, pools, queue depth, limits")
    add_server_arg(st)
    st.set_defaults(func=status)


def status(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        st = client.status()
    if args.json:
        print_json(st)
        return 0
    print(f"server   {client.url} (berth {st.server.version})")
    print(f"running  {st.running} job(s)")
    for name, p in sorted(st.pools.items()):
        slots = " ".join(f"{k}={v}" for k, v in p.slots.items())
        print(f"pool     {name}: {p.workers} worker(s) attached, slots {slots}")
        if prov := p.provisioner:
            states = " ".join(f"{k}={n}" for k, n in sorted(prov.workers.items())) or "none"
            print(f"         provisioner {prov.provider}, max {prov.max}: {states}")
            if prov.last_error:
                print(
                    f"         {prov.failures} failed start(s), next try in "
                    f"{prov.retry_in:g}s: {prov.last_error}"
                )
    for q in st.queued:
        print(f"queued   {q.jobs} {q.kind} job(s) for {q.pool or 'any pool'}")
    if not st.queued:
        print("queued   none")
    for lim in st.limits:
        print(f"limit    {limit_line(lim)}")
    return 0
