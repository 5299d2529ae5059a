"""/api/v1/audit: the newest audit entries (who wrote what, when, under which request)."""

from typing import Annotated

import msgspec
from litestar import get
from litestar.params import QueryParameter

from service.api import contract, deps
from service.auth.permissions import Perm
from service.domain import audit
from service.views import AuditEntryView


@get(
    "/api/v1/audit",
    opt={"perm": Perm.AUDIT},
    operation_id="listAudit",
    responses=contract.errors(),
)
async def list_audit(
    db: deps.Db,
    caller: deps.Caller,
    limit: Annotated[int, QueryParameter(ge=1, le=10000, description="at most this many")] = 100,
) -> list[AuditEntryView]:
    """The newest entries the caller may see, newest first."""
    entries = await audit.recent(db, caller, limit=limit)
    # str(): SQLAlchemy's column names are a str subclass, and msgspec wants plain str keys.
    return msgspec.convert(
        [{str(k): v for k, v in e.items()} for e in entries], list[AuditEntryView]
    )
