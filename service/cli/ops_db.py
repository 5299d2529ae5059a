"""The database an ops command works on, directly: no server, no credential but its own.

`[database] url` (or BERTH_DATABASE_URL) when set; otherwise the embedded Postgres under
$BERTH_HOME, started for the command when no server holds it (and stopped after it, unless a
server is using it).
"""

import contextlib
from collections.abc import Iterator
from pathlib import Path

from service.cli.client import CliError
from service.core.exits import Exit


@contextlib.contextmanager
def database_errors() -> Iterator[None]:
    """A database that cannot be reached or lets us not in is one line, never a traceback."""
    from service.db.engine import is_unavailable, refusal  # noqa: PLC0415

    try:
        yield
    except Exception as exc:
        if isinstance(exc, CliError | BrokenPipeError):  # (a closed stdout is an OSError too)
            raise
        if is_unavailable(exc):
            orig = getattr(exc, "orig", None)
            raise CliError(f"cannot reach the database: {orig or exc}", Exit.UNREACHABLE) from None
        if (said := refusal(exc)) is not None:
            raise CliError(f"the database refused: {said}", Exit.REFUSED) from None
        raise


@contextlib.contextmanager
def ops_url(config_path: Path | None) -> Iterator[str]:
    from service import config, log  # noqa: PLC0415  (server-side imports stay lazy)
    from service.db.embedded import Embedded  # noqa: PLC0415

    # stdout is the command's answer (a token, a revision): the server's log lines go to
    # stderr, and only when they matter.
    log.configure("warning")
    cfg = config.load(config_path)
    if cfg.database.url:
        with database_errors():
            yield cfg.database.url
        return
    home = config.home()
    if not (home / "postgres" / "PG_VERSION").exists():
        raise CliError(
            f"no database: neither [database] url / BERTH_DATABASE_URL nor an embedded Postgres "
            f"under {home} (run `berth serve` once to make it)"
        )
    embedded = Embedded(home)
    try:
        with database_errors():
            yield embedded.url
    finally:
        embedded.stop()
