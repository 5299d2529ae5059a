"""/api/v1/secrets: set (PUT), list names (GET), remove (DELETE). Values never come back."""

from typing import Annotated, Any

import msgspec
from litestar import Request, delete, get, put
from litestar.params import FromPath, FromQuery

from service.api import body
from service.api.body import decode
from service.api.identity import identify, request_id, runtime_of
from service.auth.permissions import Perm
from service.domain import secrets


class SecretBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # A secret becomes an environment variable: no NUL, and at most 64 KiB.
    value: Annotated[str, msgspec.Meta(max_length=64 * 1024, pattern=body.NO_NUL)]
    # Its owners: tenants, every tenant, or none of them (a system secret no job can name).
    tenants: Annotated[list[body.Name], msgspec.Meta(max_length=1000)] = msgspec.field(
        default_factory=list
    )
    tenant: body.Name | None = None  # one tenant (as `tenants` with one)
    all_tenants: bool = False


@put("/api/v1/secrets/{name:str}", opt={"perm": Perm.SECRETS}, status_code=200)
async def set_secret(request: Request[Any, Any, Any], name: FromPath[str]) -> dict[str, Any]:
    rt = runtime_of(request)
    caller = await identify(request)
    b: SecretBody = await decode(request, SecretBody)
    scopes = await secrets.put(
        rt.db,
        rt.secret_key,
        caller,
        name=name,
        value=b.value,
        tenants=[*b.tenants, *([b.tenant] if b.tenant else [])],
        all_tenants=b.all_tenants,
        request_id=request_id(request),
    )
    return {"name": name, "owners": [secrets.shown_owner(s) for s in scopes]}


@get("/api/v1/secrets", opt={"perm": Perm.SECRETS})
async def list_secrets(request: Request[Any, Any, Any]) -> list[dict[str, Any]]:
    rt = runtime_of(request)
    caller = await identify(request)
    return [
        {**s, "updated_at": s["updated_at"].isoformat()} for s in await secrets.names(rt.db, caller)
    ]


@delete("/api/v1/secrets/{name:str}", opt={"perm": Perm.SECRETS}, status_code=200)
async def remove_secret(
    request: Request[Any, Any, Any],
    name: FromPath[str],
    tenant: FromQuery[list[str] | None] = None,
    all_tenants: FromQuery[bool] = False,
) -> dict[str, Any]:
    rt = runtime_of(request)
    caller = await identify(request)
    await secrets.remove(
        rt.db,
        caller,
        name=name,
        tenants=tenant or [],
        all_tenants=all_tenants,
        request_id=request_id(request),
    )
    return {"name": name, "removed": True}
