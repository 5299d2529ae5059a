"""/api/v1/workers/join-tokens: a one-time token that lets a new node join a pool."""

import shlex
from typing import Annotated, Any

import msgspec
from litestar import Request, post

from service.api import body
from service.api.body import decode
from service.api.identity import identify, request_id, runtime_of
from service.auth.permissions import Perm
from service.domain import joining


class JoinBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pool: body.Name
    name: body.Name | None = None  # default: the pool and 8 random hex digits
    labels: Annotated[list[body.Label], msgspec.Meta(max_length=64)] = msgspec.field(
        default_factory=list
    )
    tenants: Annotated[list[body.Name], msgspec.Meta(max_length=256)] = msgspec.field(
        default_factory=list
    )
    expires_seconds: Annotated[float, msgspec.Meta(gt=0, le=30 * 86400)] = 3600.0


@post("/api/v1/workers/join-tokens", opt={"perm": Perm.FLEET_WRITE}, status_code=201)
async def create(request: Request[Any, Any, Any]) -> dict[str, Any]:
    """The token (shown once) and the paste-ready command that runs the node."""
    rt = runtime_of(request)
    caller = await identify(request)
    b: JoinBody = await decode(request, JoinBody)
    issued = await joining.issue(
        rt.db,
        caller,
        pool=b.pool,
        name=b.name,
        labels=b.labels,
        tenants=b.tenants,
        expires_seconds=b.expires_seconds,
        pools=rt.pools,
        request_id=request_id(request),
    )
    server = rt.config.network.url or str(request.base_url).rstrip("/")
    return {
        "token": issued.token,
        "name": issued.name,
        "pool": issued.pool,
        "labels": list(issued.labels),
        "tenants": list(issued.tenants),
        "expires_at": issued.expires_at.isoformat(),
        "command": f"BERTH_JOIN_TOKEN={issued.token} berth worker --server {shlex.quote(server)}",
    }
