"""`berth secret set | list | rm`: values go in, names come out, never a value."""

import argparse
import sys
from pathlib import Path
from typing import Any

from service.cli.client import Client, CliError, add_server_arg, listing, print_json


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
    body: dict[str, Any] = {"value": value, "tenants": args.tenant}
    if args.all_tenants:
        body["all_tenants"] = True
    out = Client(args.server).call("PUT", f"/api/v1/secrets/{args.name}", body)
    if args.json:
        print_json(out)
    else:
        print(f"set {args.name} for {', '.join(out['owners'])}")
    return 0


def secret_list(args: argparse.Namespace) -> int:
    rows = Client(args.server).call("GET", "/api/v1/secrets")
    return listing(
        args,
        rows,
        [[r["name"], r["owner"], r["created_by"], r["updated_at"][:19]] for r in rows],
        ["NAME", "OWNER", "SET BY", "UPDATED"],
    )


def secret_rm(args: argparse.Namespace) -> int:
    out = Client(args.server).call(
        "DELETE",
        f"/api/v1/secrets/{args.name}",
        tenant=args.tenant or None,
        all_tenants="true" if args.all_tenants else None,
    )
    if args.json:
        print_json(out)
    else:
        print(f"removed {args.name}")
    return 0
