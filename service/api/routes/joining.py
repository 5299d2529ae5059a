"""/api/v1/workers/join-tokens: a one-time token that lets a new node join a pool."""

import shlex
from typing import Annotated

import msgspec
from litestar import post
from litestar.params import JSONBody

from service.api import body, contract, deps
from service.auth.permissions import Perm
from service.domain import joining
from service.views import JoinTokenView


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


@post(
    "/api/v1/workers/join-tokens",
    opt={"perm": Perm.FLEET_WRITE},
    status_code=201,
    operation_id="createJoinToken",
    responses=contract.errors(404, 409, 413),
)
async def create(
    *,
    data: JSONBody[JoinBody],
    db: deps.Db,
    caller: deps.Caller,
    pools: deps.Pools,
    public_url: deps.PublicUrl,
    request_id: deps.RequestId,
) -> JoinTokenView:
    """The token (shown once) and the paste-ready command that runs the node."""
    issued = await joining.issue(
        db,
        caller,
        pool=data.pool,
        name=data.name,
        labels=data.labels,
        tenants=data.tenants,
        expires_seconds=data.expires_seconds,
        pools=pools,
        request_id=request_id,
    )
    command = f"BERTH_JOIN_TOKEN={issued.token} berth worker --server {shlex.quote(public_url)}"
    return JoinTokenView(
        token=issued.token,
        name=issued.name,
        pool=issued.pool,
        labels=list(issued.labels),
        tenants=list(issued.tenants),
        expires_at=issued.expires_at,
        command=command,
    )
