"""/api/v1/tokens: create (the token is in the answer, once), list, revoke."""

from typing import Annotated, Literal

import msgspec
from litestar import delete, get, post
from litestar.params import JSONBody, PathParameter, QueryParameter

from service.api import body, contract, deps
from service.auth.permissions import Perm
from service.db.records import TokenRecord
from service.domain import tokens
from service.views import CreatedTokenView, RevokedTokenView, TokenView


class TokenBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: body.Name
    kind: Literal["admin", "operator", "service", "worker", "metrics"] = "worker"
    tenants: Annotated[list[body.Name], msgspec.Meta(max_length=256)] = msgspec.field(
        default_factory=list
    )
    expires_days: Annotated[float, msgspec.Meta(gt=0, le=3650)] = 365.0


def _fields(t: TokenRecord) -> dict[str, object]:
    return {
        "name": t.name,
        "kind": t.kind,
        "tenants": t.tenants,
        "created_by": t.created_by,
        "created_at": t.created_at,
        "expires_at": t.expires_at,
        "revoked_at": t.revoked_at,
    }


def token_view(t: TokenRecord) -> TokenView:
    return TokenView(
        name=t.name,
        kind=t.kind,
        tenants=t.tenants,
        created_by=t.created_by,
        created_at=t.created_at,
        expires_at=t.expires_at,
        revoked_at=t.revoked_at,
    )


@post(
    "/api/v1/tokens",
    opt={"perm": Perm.TOKENS},
    status_code=201,
    operation_id="createToken",
    responses=contract.errors(409, 413),
)
async def create(
    data: JSONBody[TokenBody], db: deps.Db, caller: deps.Caller, request_id: deps.RequestId
) -> CreatedTokenView:
    """Mint a token; the token itself is in this answer and nowhere else, ever."""
    token, record = await tokens.create(
        db,
        caller,
        name=data.name,
        kind=data.kind,
        tenants=data.tenants,
        expires_days=data.expires_days,
        request_id=request_id,
    )
    return msgspec.convert({"token": token, **_fields(record)}, CreatedTokenView)


@get(
    "/api/v1/tokens",
    opt={"perm": Perm.TOKENS},
    operation_id="listTokens",
    responses=contract.errors(),
)
async def list_tokens(db: deps.Db, caller: deps.Caller) -> list[TokenView]:
    """The tokens the caller may see (never the tokens themselves)."""
    return [token_view(t) for t in await tokens.list_visible(db, caller)]


@delete(
    "/api/v1/tokens/{name:str}",
    opt={"perm": Perm.TOKENS},
    status_code=200,
    operation_id="revokeToken",
    responses=contract.errors(404, 409),
)
async def revoke(
    *,
    name: Annotated[str, PathParameter(description="the token's name", **body.NAME_PARAM)],
    db: deps.Db,
    caller: deps.Caller,
    request_id: deps.RequestId,
    forget_caller: deps.ForgetCaller,
    force: Annotated[
        bool, QueryParameter(description="revoke the caller's own credential or the last admin")
    ] = False,
) -> RevokedTokenView:
    """Revoke; refused (409) for the caller's own credential or the last admin, unless force."""
    record = await tokens.revoke(db, caller, name=name, force=force, request_id=request_id)
    forget_caller(name)  # at once here; other servers on the NOTIFY
    return msgspec.convert(
        {**_fields(record), "yours": caller.credential == name}, RevokedTokenView
    )
