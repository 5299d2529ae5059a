"""`berth limits set KEY=VALUE --reason TEXT | unset KEY | list`."""

import argparse
from datetime import datetime
from typing import Any

from service import views
from service.cli.client import CliError, add_server_arg, connect, listing, print_json


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser(
        "limits",
        help="override pool keys and tenant bounds of berth.toml at runtime, with a reason",
    )
    lsub = p.add_subparsers(dest="limits_command", required=True, parser_class=type(p))
    s = lsub.add_parser(
        "set",
        help="override a key on every server from its next pass",
        description="Keys: pools.P.slots.KIND, pools.P.max_load, pools.P.min_memory_gb, "
        "pools.P.min_disk_gb, pools.P.provisioner.max, pools.P.provisioner.idle_seconds, "
        "tenants.T.max_queued, tenants.T.max_stored_gb (T: a tenant, or default for every "
        "tenant without its own). Pool keys and tenants.default.* need an admin or a "
        "fleet-wide operator; an operator of some tenants sets only their tenants.T.* keys.",
    )
    add_server_arg(s)
    s.add_argument("assignment", metavar="KEY=VALUE")
    s.add_argument("--reason", required=True, help="why: shown with the limit wherever it is")
    s.set_defaults(func=set_limit)
    u = lsub.add_parser("unset", help="return a key to its berth.toml value")
    add_server_arg(u)
    u.add_argument("key", metavar="KEY")
    u.set_defaults(func=unset)
    ls = lsub.add_parser("list", help="the limits set, with who, when and why")
    add_server_arg(ls)
    ls.set_defaults(func=list_limits)


def _key(key: str) -> str:
    if not key:
        raise CliError("a limit needs a KEY, e.g. pools.gpu.slots.default")
    return key


def _shown(value: Any) -> str:  # noqa: ANN401
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _at(when: datetime) -> str:
    return when.isoformat()[:19].replace("T", " ")


def limit_line(x: views.LimitView) -> str:
    """One limit for people (`status`, `pool list`): value, berth.toml's, who, when, why."""
    state = "" if x.in_force else f" (NOT IN FORCE: {x.not_in_force_because or ''})"
    return (
        f"{x.key}={_shown(x.value)} (berth.toml: {_shown(x.default)}) set by "
        f"{x.set_by} at {_at(x.set_at)}: {' '.join(x.reason.split())}{state}"
    )


def set_limit(args: argparse.Namespace) -> int:
    key, sep, value = args.assignment.partition("=")
    key = key.strip()
    if not sep:
        raise CliError(f"expected KEY=VALUE, e.g. pools.gpu.slots.default=1; got {key!r}")
    with connect(args.server) as client:
        out = client.set_limit(_key(key), value.strip(), reason=args.reason)
    if args.json:
        print_json(out)
        return 0
    print(
        f"{out.key}={_shown(out.value)} (berth.toml: {_shown(out.default)}), "
        "in force on every server from its next pass"
    )
    return 0


def unset(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        out = client.unset_limit(_key(args.key.strip()))
    if args.json:
        print_json(out)
        return 0
    print(
        f"unset {out.key} (was {_shown(out.was)}); berth.toml's "
        f"{_shown(out.default)} is in force from the next pass"
    )
    return 0


def list_limits(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        found = client.limits()
    return listing(
        args,
        found,
        [
            [
                x.key,
                _shown(x.value) + ("" if x.in_force else " (not in force)"),
                _shown(x.default),
                x.set_by,
                _at(x.set_at),
                " ".join(x.reason.split()),
            ]
            for x in found
        ],
        ["KEY", "VALUE", "BERTH.TOML", "SET BY", "SET AT (UTC)", "REASON"],
    )
