"""Alembic, driven from code: `berth db …`, `berth serve` on the embedded database, and tests.

The migrations ship inside the wheel (service/_migrations); in a source checkout they are the
top-level migrations/ folder.
"""

import asyncio
import io
from contextlib import redirect_stdout
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import create_async_engine

from service.db.engine import async_url


def script_location() -> Path:
    packaged = Path(str(resources.files("service"))) / "_migrations"
    if (packaged / "env.py").exists():
        return packaged
    return Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(script_location()))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate to `revision`. Blocking: call from a thread when inside an event loop."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def history(url: str) -> str:
    out = io.StringIO()
    cfg = alembic_config(url)
    cfg.stdout = out
    with redirect_stdout(out):
        command.history(cfg)
    return out.getvalue()


def head() -> str:
    heads = ScriptDirectory.from_config(alembic_config("")).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations have {len(heads)} heads; merge them")
    return heads[0]


async def current(url: str) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    engine = create_async_engine(async_url(url))
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(
                lambda sync: MigrationContext.configure(sync).get_current_revision()
            )
    finally:
        await engine.dispose()


async def is_current(url: str) -> bool:
    return await current(url) == await asyncio.to_thread(head)
