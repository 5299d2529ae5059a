"""/api/v1/tokens: create (the token is in the answer, once), list, revoke."""

from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, delete, get, post
from litestar.params import FromPath, FromQuery

from service.api import body
from service.api.body import decode
from service.api.identity import identify, request_id, runtime_of
from service.auth.permissions import Perm
from service.db.records import TokenRecord
from service.domain import tokens


class TokenBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: body.Name
    kind: Literal["admin", "operator", "service", "worker", "metrics"] = "worker"
    tenants: Annotated[list[body.Name], msgspec.Meta(max_length=256)] = msgspec.field(
        default_factory=list
    )
    expires_days: Annotated[float, msgspec.Meta(gt=0, le=3650)] = 365.0


def token_json(t: TokenRecord) -> dict[str, Any]:
    return {
        "name": t.name,
        "kind": t.kind,
        "tenants": t.tenants,
        "created_by": t.created_by,
        "created_at": t.created_at.isoformat(),
        "expires_at": t.expires_at.isoformat(),
        "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
    }


@post("/api/v1/tokens", opt={"perm": Perm.TOKENS}, status_code=201)
async def create(request: Request[Any, Any, Any]) -> dict[str, Any]:
    rt = runtime_of(request)
    caller = await identify(request)
    b: TokenBody = await decode(request, TokenBody)
    token, record = await tokens.create(
        rt.db,
        caller,
        name=b.name,
        kind=b.kind,
        tenants=b.tenants,
        expires_days=b.expires_days,
        request_id=request_id(request),
    )
    return {"token": token, **token_json(record)}


@get("/api/v1/tokens", opt={"perm": Perm.TOKENS})
async def list_tokens(request: Request[Any, Any, Any]) -> list[dict[str, Any]]:
    rt = runtime_of(request)
    caller = await identify(request)
    return [token_json(t) for t in await tokens.list_visible(rt.db, caller)]


@delete("/api/v1/tokens/{name:str}", opt={"perm": Perm.TOKENS}, status_code=200)
async def revoke(
    request: Request[Any, Any, Any], name: FromPath[str], force: FromQuery[bool] = False
) -> dict[str, Any]:
    """Revoke; refused (409) for the caller's own credential or the last admin, unless force."""
    rt = runtime_of(request)
    caller = await identify(request)
    record = await tokens.revoke(
        rt.db, caller, name=name, force=force, request_id=request_id(request)
    )
    rt.forget_caller(name)  # at once here; other servers on the NOTIFY
    return {**token_json(record), "yours": caller.credential == name}
