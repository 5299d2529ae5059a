"""Alembic environment: async, against asyncpg, comparing with service.db.schema.metadata.

The URL comes from the caller (`service.db.migrate` sets it on the Config), else from
BERTH_DATABASE_URL, so `alembic check` works in CI with nothing but that variable.
"""

import asyncio
import os

from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from service.db.engine import async_url
from service.db.schema import metadata

config = context.config


def _url() -> str:
    url = config.attributes.get("url") or os.environ.get("BERTH_DATABASE_URL", "")
    if not url:
        raise SystemExit("set BERTH_DATABASE_URL to the database to migrate")
    return async_url(url)


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _online() -> None:
    engine = create_async_engine(_url(), poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_online())
