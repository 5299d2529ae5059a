"""`berth token create | list | revoke`."""

import argparse
import sys
from typing import Any

from service.cli.client import add_server_arg, connect, listing, print_json
from service.core import durations


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser("token", help="create, list and revoke tokens")
    tsub = p.add_subparsers(dest="token_command", required=True, parser_class=type(p))
    c = tsub.add_parser("create", help="create a token; prints it once")
    add_server_arg(c)
    c.add_argument("name")
    c.add_argument(
        "--kind", choices=["worker", "service", "operator", "admin", "metrics"], default="worker"
    )
    c.add_argument("--tenant", action="append", default=[], dest="tenants")
    c.add_argument(
        "--expires", type=_duration, default="365d", metavar="DURATION", help="90s, 15m, 1h, 30d"
    )
    c.set_defaults(func=create)
    ls = tsub.add_parser("list", help="list tokens (never their values)")
    add_server_arg(ls)
    ls.set_defaults(func=list_tokens)
    r = tsub.add_parser("revoke", help="revoke a token; a worker using it exits")
    add_server_arg(r)
    r.add_argument("name")
    r.add_argument(
        "--force",
        action="store_true",
        help="also the token you are using, or the last live admin token",
    )
    r.set_defaults(func=revoke)


def _duration(text: str) -> float:
    try:
        return durations.seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def create(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        out = client.create_token(
            args.name, kind=args.kind, tenants=args.tenants, expires_days=args.expires / 86400
        )
    if args.json:
        print_json(out)
    else:
        print(out.token)
    return 0


def list_tokens(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        tokens = client.tokens()
    return listing(
        args,
        tokens,
        [
            [
                t.name,
                t.kind,
                ",".join(t.tenants) or "-",
                t.expires_at.isoformat()[:10],
                "revoked" if t.revoked_at else "live",
                t.created_by,
            ]
            for t in tokens
        ],
        ["NAME", "KIND", "TENANTS", "EXPIRES", "STATE", "CREATED BY"],
    )


def revoke(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        out = client.revoke_token(args.name, force=args.force)
    if args.json:
        print_json(out)
        return 0
    print(f"revoked {out.name}")
    if out.yours:
        print(
            f"{out.name} was the token this command used: it no longer works. "
            "Use another token, or mint a new admin token on the database's host with "
            "`berth db admin-token NAME`.",
            file=sys.stderr,
        )
    return 0
