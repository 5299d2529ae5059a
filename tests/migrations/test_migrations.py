"""Migrations: one head, a clean round trip, and no drift between models and migrations."""

import asyncio

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import create_async_engine

from service.db import migrate
from service.db.engine import async_url
from service.db.schema import metadata
from tests import pg


class TestMigrations:
    def test_single_head(self):
        """The migration history has exactly one head."""
        heads = ScriptDirectory.from_config(migrate.alembic_config("")).get_heads()
        assert len(heads) == 1

    def test_round_trip_on_an_empty_database(self, pg_admin_url):
        """upgrade head -> downgrade base -> upgrade head works on an empty database."""
        with pg.scratch(pg_admin_url, "berth_roundtrip") as url:
            migrate.upgrade(url)
            assert asyncio.run(migrate.current(url)) == migrate.head()
            migrate.downgrade(url, "base")
            assert asyncio.run(migrate.current(url)) is None
            migrate.upgrade(url)
            assert asyncio.run(migrate.current(url)) == migrate.head()

    def test_models_match_migrations(self, pg_admin_url, template_db):
        """Autogenerate finds nothing to add: schema.py and the migrations agree."""
        url = pg.with_db(pg_admin_url, template_db)

        async def diff() -> list:
            engine = create_async_engine(async_url(url))
            try:
                async with engine.connect() as conn:
                    return await conn.run_sync(
                        lambda c: compare_metadata(MigrationContext.configure(c), metadata)
                    )
            finally:
                await engine.dispose()

        assert asyncio.run(diff()) == []

    def test_unmigrated_database_is_detected(self, pg_admin_url):
        """A database that was never migrated reports no current revision."""
        with pg.scratch(pg_admin_url, "berth_empty") as url:
            assert asyncio.run(migrate.current(url)) is None
            assert asyncio.run(migrate.is_current(url)) is False
