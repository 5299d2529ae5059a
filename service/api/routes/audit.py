"""/api/v1/audit: the newest audit entries (who wrote what, when, under which request)."""

from typing import Any

from litestar import Request, get
from litestar.params import FromQuery

from service.api.identity import identify, runtime_of
from service.auth.permissions import Perm
from service.core.errors import Invalid
from service.domain import audit


@get("/api/v1/audit", opt={"perm": Perm.AUDIT})
async def list_audit(
    request: Request[Any, Any, Any], limit: FromQuery[int] = 100
) -> list[dict[str, Any]]:
    if not 1 <= limit <= 10000:
        raise Invalid("limit must be between 1 and 10000")
    rt = runtime_of(request)
    caller = await identify(request)
    return [
        {**e, "at": e["at"].isoformat()} for e in await audit.recent(rt.db, caller, limit=limit)
    ]
