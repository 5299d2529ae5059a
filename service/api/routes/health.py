"""/healthz (the process answers) and /readyz (the database answers and is migrated)."""

from typing import Any

from litestar import Request, get
from sqlalchemy import text

from service.api.identity import runtime_of
from service.core.errors import Unavailable


@get("/healthz", opt={"public": True})
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz", opt={"public": True})
async def readyz(request: Request[Any, Any, Any]) -> dict[str, str]:
    rt = runtime_of(request)
    try:
        async with rt.db.begin() as conn:
            await conn.execute(text("SELECT 1 FROM alembic_version"))
    except Unavailable:
        raise
    except Exception as exc:  # an unmigrated database answers, but is not ready
        raise Unavailable("the database is not migrated") from exc
    return {"status": "ready"}
