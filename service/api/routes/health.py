"""/healthz (the process answers) and /readyz (the database answers and is migrated).

A dead database fails /readyz (503, the reason in the JSON body), never /healthz: the process
is healthy and the server restarts its embedded Postgres itself, so an orchestrator should
route around it, not kill it.
"""

from litestar import get
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError

from service.api import contract, deps
from service.core.errors import Unavailable
from service.views import HealthView


@get(
    "/healthz",
    opt={"public": True},
    operation_id="healthz",
    responses=contract.errors(public=True),
    operation_class=contract.PublicOperation,
)
async def healthz() -> HealthView:
    """The process answers."""
    return HealthView(status="ok")


@get(
    "/readyz",
    opt={"public": True},
    operation_id="readyz",
    responses=contract.errors(503, public=True),
    operation_class=contract.PublicOperation,
)
async def readyz(db: deps.Db, embedded: deps.Embedded) -> HealthView:
    """The database answers and is migrated; 503 saying why otherwise."""
    if embedded is not None and (why := embedded.down_reason()):
        raise Unavailable(why)
    try:
        async with db.begin() as conn:
            await conn.execute(text("SELECT 1 FROM alembic_version"))
    except ProgrammingError as exc:  # an unmigrated database answers, but is not ready
        if _sqlstate(exc) != UNDEFINED_TABLE:
            raise
        raise Unavailable("the database is not migrated") from exc
    return HealthView(status="ready")


UNDEFINED_TABLE = "42P01"  # no alembic_version: nothing was ever migrated into this database


def _sqlstate(exc: ProgrammingError) -> str:
    cause = getattr(exc.orig, "__cause__", None) or exc.orig
    return str(getattr(cause, "sqlstate", "") or "")
