"""`berth db upgrade | current | history | admin-token NAME`: ops commands on the database.

They work on the configured database directly, with no server and no credential but the
database's own: `[database] url` / BERTH_DATABASE_URL, else the embedded Postgres under
$BERTH_HOME (cli/ops_db.py). `admin-token` is the way back in when no admin token is left.
"""

import argparse
import asyncio
import getpass
import sys
from pathlib import Path
from typing import Any

from service.cli.client import CliError
from service.cli.ops_db import ops_url


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser("db", help="the database: migrations, and a break-glass admin token")
    dsub = p.add_subparsers(dest="db_command", required=True, parser_class=type(p))
    for action, text in (
        ("upgrade", "migrate the database to this berth's schema (Alembic)"),
        ("current", "the schema revision the database is at"),
        ("history", "the migrations"),
    ):
        a = dsub.add_parser(action, help=text)
        a.add_argument("--config", type=Path)
        a.set_defaults(func=migrations, action=action)
    t = dsub.add_parser(
        "admin-token",
        help="break-glass: mint a new admin token on the database directly (no server needed)",
    )
    t.add_argument("name", help="the new token's name")
    t.add_argument("--config", type=Path)
    t.set_defaults(func=admin_token)


def migrations(args: argparse.Namespace) -> int:
    from service.db import migrate  # noqa: PLC0415  (server-side imports stay lazy)

    with ops_url(args.config) as url:
        if args.action == "upgrade":
            migrate.upgrade(url)
            print(f"migrated to {migrate.head()}")
        elif args.action == "current":
            print(asyncio.run(migrate.current(url)) or "(not migrated)")
        else:
            print(migrate.history(url), end="")
    return 0


def admin_token(args: argparse.Namespace) -> int:
    from service import config  # noqa: PLC0415  (server-side imports stay lazy)
    from service.db import migrate  # noqa: PLC0415
    from service.db.embedded import write_private  # noqa: PLC0415
    from service.db.engine import Database  # noqa: PLC0415
    from service.domain import secrets, tokens  # noqa: PLC0415

    user = getpass.getuser()
    # With the secret key (where the server runs), the break-glass entry is signed like the
    # server's and sealed into the chain; without it the sealer names it as not the server's.
    key = secrets.read_key(config.home())

    async def mint(url: str) -> str:
        if not await migrate.is_current(url):
            raise CliError("the database is not migrated to this berth: run `berth db upgrade`")
        db = Database(url, pool_size=1, secret_key=key)
        try:
            return await tokens.break_glass(db, name=args.name, os_user=user)
        finally:
            await db.dispose()

    with ops_url(args.config) as url:
        token = asyncio.run(mint(url))
    home = config.home()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = write_private(home / "admin.token", token + "\n")
    print(token)
    print(f"admin token {args.name} minted as ops:{user}; also written to {path}", file=sys.stderr)
    return 0
