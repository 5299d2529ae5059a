"""Recording writes: every write is signed with its caller, in the transaction that makes it."""

from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.auth.callers import Caller
from service.db.queries import audit as audit_q


async def record(
    conn: AsyncConnection,
    caller: Caller | str,
    action: str,
    target: str,
    *,
    tenant: str | None = None,
    request_id: str = "",
    **detail: Any,  # noqa: ANN401  (JSON-able details, stored as jsonb)
) -> None:
    await audit_q.append(
        conn,
        [
            {
                "caller": str(caller),
                "action": action,
                "target": target,
                "tenant": tenant,
                "request_id": request_id,
                "detail": detail,
            }
        ],
    )
