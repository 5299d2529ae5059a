"""/api/v1/limits: list (GET), set (PUT) and unset (DELETE) operator overrides of berth.toml.

A write is in force on this server when the answer comes back, and on every other server once
its NOTIFY arrives (api/limits_watch.py).
"""

import contextlib
from typing import Annotated, Any

import msgspec
from litestar import Request, delete, get, put
from litestar.params import FromPath

from service.api import body
from service.api.body import decode
from service.api.identity import identify, request_id, runtime_of
from service.api.runtime import Runtime
from service.auth.permissions import Perm
from service.core import limits as core_limits
from service.core.errors import Unavailable
from service.domain import limits
from service.domain.limits import MAX_REASON


class LimitBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Any JSON here: core.limits.parse refuses a wrong type naming the key and what it must be.
    value: Any
    reason: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REASON, pattern=body.NO_NUL)]


@get("/api/v1/limits", opt={"perm": Perm.FLEET_READ})
async def list_limits(request: Request[Any, Any, Any]) -> list[dict[str, Any]]:
    """Every limit set that the caller may see: value, berth.toml's (`default`), who, when, why.

    A caller that is not fleet-wide sees no other tenant's keys.
    """
    rt = runtime_of(request)
    caller = await identify(request)
    return (await limits.in_force(rt.db, rt.config)).shown(to=caller)


@put("/api/v1/limits/{key:str}", opt={"perm": Perm.FLEET_WRITE}, status_code=200)
async def set_limit(request: Request[Any, Any, Any], key: FromPath[str]) -> dict[str, Any]:
    rt = runtime_of(request)
    caller = await identify(request)
    b: LimitBody = await decode(request, LimitBody)
    record = await limits.put(
        rt.db,
        rt.config,
        caller,
        key=key,
        value=b.value,
        reason=b.reason,
        request_id=request_id(request),
    )
    await _apply(rt)
    return limits.describe(rt.config, record)


@delete("/api/v1/limits/{key:str}", opt={"perm": Perm.FLEET_WRITE}, status_code=200)
async def unset_limit(request: Request[Any, Any, Any], key: FromPath[str]) -> dict[str, Any]:
    rt = runtime_of(request)
    caller = await identify(request)
    removed = await limits.remove(rt.db, caller, key=key, request_id=request_id(request))
    await _apply(rt)
    return {
        "key": key,
        "unset": True,
        "was": removed.value,
        "default": core_limits.default(rt.config, key),
    }


async def _apply(rt: Runtime) -> None:
    """In force here before the answer; other servers follow the NOTIFY."""
    with contextlib.suppress(Unavailable):  # committed: the watch's next read applies it
        await rt.limits_watch.refresh()
