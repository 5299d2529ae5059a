"""`berth db upgrade | current | history`: ops commands on the configured database directly."""

import argparse
import asyncio
from pathlib import Path
from typing import Any

from service.cli.client import CliError


def add(sub: Any) -> None:  # noqa: ANN401
    p = sub.add_parser("db", help="migrate the configured database (Alembic)")
    p.add_argument("--config", type=Path)
    p.add_argument("action", choices=["upgrade", "current", "history"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from service import config  # noqa: PLC0415  (server-side imports stay lazy)
    from service.db import migrate  # noqa: PLC0415

    cfg = config.load(args.config)
    url = cfg.database.url
    if not url:
        raise CliError(
            "no database configured ([database] url or BERTH_DATABASE_URL); "
            "the embedded one is migrated by `berth serve` itself"
        )
    try:
        if args.action == "upgrade":
            migrate.upgrade(url)
            print(f"migrated to {migrate.head()}")
        elif args.action == "current":
            print(asyncio.run(migrate.current(url)) or "(not migrated)")
        else:
            print(migrate.history(url), end="")
    except (OSError, ConnectionError) as exc:
        raise CliError(f"cannot reach the database: {exc}", 3) from None
    return 0
