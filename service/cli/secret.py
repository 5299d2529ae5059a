"""`berth secret set | list | rm`: values go in, names come out, never a value."""

import argparse
import sys
from pathlib import Path
from typing import Any

from service.cli.client import CliError, add_server_arg, connect, listing, print_json


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser("secret", help="set, list and remove secrets (values never shown)")
    ssub = p.add_subparsers(dest="secret_command", required=True, parser_class=type(p))
    st = ssub.add_parser("set", help="set a secret from a file or stdin")
    add_server_arg(st)
    st.add_argument("name")
    src = st.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-file", type=Path)
    src.add_argument("--stdin", action="store_true")
    owner = st.add_mutually_exclusive_group()
    owner.add_argument(
        "--tenant",
        action="append",
        default=[],
        help="a tenant whose jobs may use it (repeat for several); none: a system secret, "
        "which no job can name (the shared worker credential)",
    )
    owner.add_argument(
        "--all-tenants", action="store_true", help="every tenant's jobs may use it (audited)"
    )
    st.set_defaults(func=secret_set)
    ls = ssub.add_parser("list", help="secret names")
    add_server_arg(ls)
    ls.set_defaults(func=secret_list)
    rm = ssub.add_parser("rm", help="remove a secret")
    add_server_arg(rm)
    rm.add_argument("name")
    rm_owner = rm.add_mutually_exclusive_group()
    rm_owner.add_argument("--tenant", action="append", default=[])
    rm_owner.add_argument("--all-tenants", action="store_true")
    rm.set_defaults(func=secret_rm)


def secret_set(args: argparse.Namespace) -> int:
    if args.stdin:
        value = sys.stdin.read()
    else:
        try:
            value = args.from_file.read_text()
        except OSError as exc:
            raise CliError(f"cannot read {args.from_file}: {exc.strerror}") from None
    value = value.removesuffix("\n")
    with connect(args.server) as client:
        out = client.set_secret(args.name, value, tenants=args.tenant, all_tenants=args.all_tenants)
    if args.json:
        print_json(out)
    else:
        print(f"set {args.name} for {', '.join(out.owners)}")
    return 0


def secret_list(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        rows = client.secrets()
    return listing(
        args,
        rows,
        [[r.name, r.owner, r.created_by, r.updated_at.isoformat()[:19]] for r in rows],
        ["NAME", "OWNER", "SET BY", "UPDATED"],
    )


def secret_rm(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        out = client.remove_secret(args.name, tenants=args.tenant, all_tenants=args.all_tenants)
    if args.json:
        print_json(out)
    else:
        print(f"removed {args.name}")
    return 0
