"""/api/v1/limits: list (GET), set (PUT) and unset (DELETE) operator overrides of berth.toml.

A write is in force on this server when the answer comes back, and on every other server once
its NOTIFY arrives (api/limits_watch.py).
"""

import contextlib
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import msgspec
from litestar import delete, get, put
from litestar.params import JSONBody, PathParameter

from service.api import body, contract, deps
from service.auth.permissions import Perm
from service.core import limits as core_limits
from service.core.errors import Unavailable
from service.domain import limits
from service.domain.limits import MAX_REASON
from service.views import LimitUnsetView, LimitView

Key = Annotated[
    str,
    PathParameter(
        description="pools.NAME.FIELD or tenants.NAME.FIELD",
        max_length=core_limits.MAX_KEY,
        # In the document only: the domain refuses another key naming the rule it breaks.
        schema_extra={"pattern": core_limits.KEY_PATTERN},
    ),
]


class LimitBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Any JSON here: core.limits.parse refuses a wrong type naming the key and what it must be.
    value: Any
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REASON, pattern=body.NO_NUL)]


@get(
    "/api/v1/limits",
    opt={"perm": Perm.FLEET_READ},
    operation_id="listLimits",
    responses=contract.errors(),
)
async def list_limits(db: deps.Db, caller: deps.Caller, config: deps.BerthToml) -> list[LimitView]:
    """Every limit set that the caller may see: value, berth.toml's (`default`), who, when, why.

    A caller that is not fleet-wide sees no other tenant's keys.
    """
    shown = (await limits.in_force(db, config)).shown(to=caller)
    return msgspec.convert(shown, list[LimitView])


@put(
    "/api/v1/limits/{key:str}",
    opt={"perm": Perm.FLEET_WRITE},
    status_code=200,
    operation_id="setLimit",
    responses=contract.errors(413),
)
async def set_limit(
    *,
    key: Key,
    data: JSONBody[LimitBody],
    db: deps.Db,
    caller: deps.Caller,
    config: deps.BerthToml,
    request_id: deps.RequestId,
    refresh_limits: deps.RefreshLimits,
) -> LimitView:
    """Set a limit: in force on this server when this answers, on the others on their NOTIFY."""
    record = await limits.put(
        db, config, caller, key=key, value=data.value, reason=data.reason, request_id=request_id
    )
    await _apply(refresh_limits)
    return msgspec.convert(limits.describe(config, record), LimitView)


@delete(
    "/api/v1/limits/{key:str}",
    opt={"perm": Perm.FLEET_WRITE},
    status_code=200,
    operation_id="unsetLimit",
    responses=contract.errors(404),
)
async def unset_limit(
    *,
    key: Key,
    db: deps.Db,
    caller: deps.Caller,
    config: deps.BerthToml,
    request_id: deps.RequestId,
    refresh_limits: deps.RefreshLimits,
) -> LimitUnsetView:
    """Unset a limit: berth.toml's value (`default`) is in force again."""
    removed = await limits.remove(db, caller, key=key, request_id=request_id)
    await _apply(refresh_limits)
    return LimitUnsetView(
        key=key, unset=True, was=removed.value, default=core_limits.default(config, key)
    )


async def _apply(refresh_limits: Callable[[], Awaitable[bool]]) -> None:
    """In force here before the answer; other servers follow the NOTIFY."""
    with contextlib.suppress(Unavailable):  # committed: the watch's next read applies it
        await refresh_limits()
