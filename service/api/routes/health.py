"""/healthz (the process answers) and /readyz (the database answers and is migrated).

A dead database fails /readyz (503, the reason in the JSON body), never /healthz: the process
is healthy and the server restarts its embedded Postgres itself, so an orchestrator should
route around it, not kill it.
"""

from typing import Any

from litestar import Request, get
from sqlalchemy import text
from sqlalchemy.exc import ProgrammingError

from service.api.identity import runtime_of
from service.core.errors import Unavailable


@get("/healthz", opt={"public": True})
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz", opt={"public": True})
async def readyz(request: Request[Any, Any, Any]) -> dict[str, str]:
    rt = runtime_of(request)
    if rt.embedded is not None and (why := rt.embedded.down_reason()):
        raise Unavailable(why)
    try:
        async with rt.db.begin() as conn:
            await conn.execute(text("SELECT 1 FROM alembic_version"))
    except ProgrammingError as exc:  # an unmigrated database answers, but is not ready
        if _sqlstate(exc) != UNDEFINED_TABLE:
            raise
        raise Unavailable("the database is not migrated") from exc
    return {"status": "ready"}


UNDEFINED_TABLE = "42P01"  # no alembic_version: nothing was ever migrated into this database


def _sqlstate(exc: ProgrammingError) -> str:
    cause = getattr(exc.orig, "__cause__", None) or exc.orig
    return str(getattr(cause, "sqlstate", "") or "")
