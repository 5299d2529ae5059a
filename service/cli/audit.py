"""`berth audit list` (through a server) and `berth audit verify | head` (on the database)."""

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from service.cli.client import CliError, add_server_arg, connect, listing
from service.cli.ops_db import ops_url
from service.core.exits import Exit


def add(sub: Any) -> None:  # noqa: ANN401
    a = sub.add_parser("audit", help="the audit log")
    asub = a.add_subparsers(dest="audit_command", required=True, parser_class=type(a))
    al = asub.add_parser("list", help="newest entries")
    add_server_arg(al)
    al.add_argument("--limit", type=int, default=50)
    al.set_defaults(func=audit_list)
    av = asub.add_parser(
        "verify", help="check the keyed hash chain, on the database directly (needs the secret key)"
    )
    av.add_argument("--config", type=Path)
    av.add_argument(
        "--head", metavar="SEQ:HASH", help="a head recorded earlier: detects deleted newest entries"
    )
    av.set_defaults(func=audit_verify)
    ah = asub.add_parser("head", help="the newest sealed entry as SEQ:HASH, to record elsewhere")
    ah.add_argument("--config", type=Path)
    ah.set_defaults(func=audit_head)


def audit_list(args: argparse.Namespace) -> int:
    with connect(args.server) as client:
        rows = client.audit(limit=args.limit)
    return listing(
        args,
        rows,
        [
            [str(r.seq or "-"), r.at.isoformat()[:19], r.caller, r.action, r.target[:40]]
            for r in rows
        ],
        ["SEQ", "AT", "CALLER", "ACTION", "TARGET"],
    )


def audit_verify(args: argparse.Namespace) -> int:
    from service import config  # noqa: PLC0415  (server-side imports stay lazy)
    from service.core import audit_chain  # noqa: PLC0415
    from service.db.engine import Database  # noqa: PLC0415
    from service.domain import audit, secrets  # noqa: PLC0415

    head = None
    if args.head:
        try:
            head = audit_chain.parse_head(args.head)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    home = config.home()
    key = secrets.read_key(home)
    recorded = None
    kept = home / "audit.head"  # the head this home's server sealed (background/audit_seal.py)
    if kept.exists():
        try:
            recorded = audit_chain.parse_head(kept.read_text().strip())
        except (ValueError, OSError) as exc:
            raise CliError(f"{kept}: {exc}") from None

    async def run(url: str) -> audit.Verification:
        db = Database(url, pool_size=1)
        try:
            return await audit.verify(db, key, heads=[head] if head else [], recorded=recorded)
        finally:
            await db.dispose()

    with ops_url(args.config) as url:
        result = asyncio.run(run(url))
    if result.broken:
        print(f"berth: audit chain broken: {result.broken}", file=sys.stderr)
        return 1  # what a check that fails exits with, as `cmp` and `diff` do
    print(
        f"audit chain intact: {result.keyed + result.plain} entries verified "
        f"({result.keyed} keyed, {result.plain} sealed before keys), "
        f"{result.pending} not yet sealed"
    )
    return 0


def audit_head(args: argparse.Namespace) -> int:
    from service.core import audit_chain  # noqa: PLC0415  (server-side imports stay lazy)
    from service.db.engine import Database  # noqa: PLC0415
    from service.domain import audit  # noqa: PLC0415

    async def run(url: str) -> tuple[int, bytes] | None:
        db = Database(url, pool_size=1)
        try:
            return await audit.head(db)
        finally:
            await db.dispose()

    with ops_url(args.config) as url:
        found = asyncio.run(run(url))
    if found is None:
        raise CliError("no audit entry is sealed yet", Exit.NOT_FOUND)
    print(audit_chain.show_head(*found))
    return 0
