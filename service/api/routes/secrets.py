"""/api/v1/secrets: set (PUT), list names (GET), remove (DELETE). Values never come back."""

from typing import Annotated, Any, ClassVar

import msgspec
from litestar import delete, get, put
from litestar.params import FromQuery, JSONBody, PathParameter, QueryParameter

from service.api import body, contract, deps
from service.auth.permissions import Perm
from service.domain import secrets
from service.views import RemovedView, SecretSetView, SecretView

SecretName = Annotated[str, PathParameter(description="the secret's name", **body.NAME_PARAM)]


class SecretBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # A secret becomes an environment variable: no NUL, and at most 64 KiB.
    value: Annotated[str, msgspec.Meta(max_length=64 * 1024, pattern=body.NO_NUL)]
    # Its owners: tenants, every tenant, or none of them (a system secret no job can name).
    tenants: Annotated[list[body.Name], msgspec.Meta(max_length=1000)] = msgspec.field(
        default_factory=list
    )
    tenant: body.Name | None = None  # one tenant (as `tenants` with one)
    all_tenants: bool = False

    # domain/secrets.py owners' rule, in the document: every tenant, or named ones, not both.
    JSON_SCHEMA_EXTRA: ClassVar[dict[str, Any]] = {
        "anyOf": [
            {"properties": {"all_tenants": {"const": False}}},
            {"properties": {"tenants": {"maxItems": 0}, "tenant": {"type": "null"}}},
        ]
    }


@put(
    "/api/v1/secrets/{name:str}",
    opt={"perm": Perm.SECRETS},
    status_code=200,
    operation_id="setSecret",
    responses=contract.errors(404, 413),
)
async def set_secret(
    *,
    name: SecretName,
    data: JSONBody[SecretBody],
    db: deps.Db,
    caller: deps.Caller,
    secret_key: deps.SecretKey,
    request_id: deps.RequestId,
) -> SecretSetView:
    """Set a secret for its owners (each its own row, sealed to its owner)."""
    scopes = await secrets.put(
        db,
        secret_key,
        caller,
        name=name,
        value=data.value,
        tenants=[*data.tenants, *([data.tenant] if data.tenant else [])],
        all_tenants=data.all_tenants,
        request_id=request_id,
    )
    return SecretSetView(name=name, owners=[secrets.shown_owner(s) for s in scopes])


@get(
    "/api/v1/secrets",
    opt={"perm": Perm.SECRETS},
    operation_id="listSecrets",
    responses=contract.errors(),
)
async def list_secrets(db: deps.Db, caller: deps.Caller) -> list[SecretView]:
    """The names (never the values) of the secrets the caller may see."""
    found = await secrets.names(db, caller)
    # str(): SQLAlchemy's column names are a str subclass, and msgspec wants plain str keys.
    return msgspec.convert([{str(k): v for k, v in s.items()} for s in found], list[SecretView])


@delete(
    "/api/v1/secrets/{name:str}",
    opt={"perm": Perm.SECRETS},
    status_code=200,
    operation_id="removeSecret",
    responses=contract.errors(404),
)
async def remove_secret(
    *,
    name: SecretName,
    db: deps.Db,
    caller: deps.Caller,
    request_id: deps.RequestId,
    tenant: Annotated[
        list[body.Name] | None, QueryParameter(description="the owners to remove it from")
    ] = None,
    all_tenants: FromQuery[bool] = False,
) -> RemovedView:
    """Remove a secret from its owners (the caller's tenant when none is named)."""
    await secrets.remove(
        db,
        caller,
        name=name,
        tenants=tenant or [],
        all_tenants=all_tenants,
        request_id=request_id,
    )
    return RemovedView(name=name, removed=True)
