"""Secrets: set, list (names only), remove, and resolve the ones a job names for its lease.

The key: BERTH_SECRET_KEY (base64 of 32 bytes), else a key file in $BERTH_HOME created 0600 on
first use. Several servers sharing one Postgres must share the key (set BERTH_SECRET_KEY).
Values are never logged, never listed, and go to a worker only in a lease that names them.
"""

import base64
import binascii
import os
import secrets as stdlib_secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from service.auth.callers import Caller
from service.core import secretbox
from service.core.errors import Forbidden, Invalid, NotFound
from service.db.engine import Database
from service.db.queries import secrets as secrets_q
from service.domain import audit
from service.domain.tokens import check_name

MAX_VALUE = 64 * 1024


def load_key(home: Path, environ: Mapping[str, str] = os.environ) -> bytes:
    """The secrets key from BERTH_SECRET_KEY, else $BERTH_HOME/secret.key (made on first use)."""
    if encoded := environ.get("BERTH_SECRET_KEY"):
        try:
            key = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise Invalid("BERTH_SECRET_KEY must be base64 of 32 bytes") from None
        if len(key) != secretbox.KEY_BYTES:
            raise Invalid("BERTH_SECRET_KEY must be base64 of 32 bytes")
        return key
    path = home / "secret.key"
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64encode(stdlib_secrets.token_bytes(secretbox.KEY_BYTES)) + b"\n")
    return base64.b64decode(path.read_bytes().strip())


def read_key(home: Path, environ: Mapping[str, str] = os.environ) -> bytes | None:
    """The key as the server finds it, without making one (ops commands); None when absent."""
    if environ.get("BERTH_SECRET_KEY") or (home / "secret.key").exists():
        return load_key(home, environ)
    return None


def _scope(caller: Caller, tenant: str | None) -> str:
    """The tenant a secret belongs to ('' = global); callers touch only their tenants'."""
    if not tenant:
        if not caller.all_tenants:
            raise Forbidden("only an admin may manage global secrets; name your tenant")
        return ""
    check_name(tenant, "tenant")
    if not caller.sees(tenant):
        raise NotFound(f"no tenant {tenant!r}")
    return tenant


async def put(
    db: Database,
    key: bytes,
    caller: Caller,
    *,
    name: str,
    value: str,
    tenant: str | None,
    request_id: str = "",
) -> None:
    check_name(name, "secret name")
    if len(value.encode()) > MAX_VALUE:
        raise Invalid(f"a secret holds at most {MAX_VALUE} bytes")
    scope = _scope(caller, tenant)
    nonce, ciphertext = secretbox.seal(key, value.encode(), tenant=scope, name=name)
    async with db.begin() as conn:
        await secrets_q.put(
            conn, tenant=scope, name=name, nonce=nonce, ciphertext=ciphertext, by=str(caller)
        )
        await audit.record(
            conn, caller, "secret.set", name, tenant=scope or None, request_id=request_id
        )


async def names(db: Database, caller: Caller) -> list[dict[str, Any]]:
    async with db.begin() as conn:
        return await secrets_q.names(conn, tenants=caller.tenant_filter())


async def remove(
    db: Database, caller: Caller, *, name: str, tenant: str | None, request_id: str = ""
) -> None:
    scope = _scope(caller, tenant)
    async with db.begin() as conn:
        if not await secrets_q.remove(conn, tenant=scope, name=name):
            raise NotFound(f"no secret {name!r}" + (f" in tenant {scope!r}" if scope else ""))
        await audit.record(
            conn, caller, "secret.removed", name, tenant=scope or None, request_id=request_id
        )


async def check_exist(db: Database, *, tenant: str, names: Iterable[str]) -> None:
    """Invalid naming the first secret jobs ask for that neither their tenant nor global has."""
    wanted = sorted(set(names))
    async with db.begin() as conn:
        found = await secrets_q.sealed_for(conn, tenant=tenant, names_=wanted)
    for name in wanted:
        if (tenant, name) not in found and ("", name) not in found:
            raise Invalid(f"no secret {name!r} for tenant {tenant!r}")


async def for_lease(
    db: Database, key: bytes, *, tenant: str, wanted: Mapping[str, str]
) -> dict[str, str]:
    """Variable -> value for a job's lease; the tenant's own secret wins over a global one."""
    if not wanted:
        return {}
    async with db.begin() as conn:
        found = await secrets_q.sealed_for(conn, tenant=tenant, names_=sorted(set(wanted.values())))
    out = {}
    for variable, name in wanted.items():
        scope = tenant if (tenant, name) in found else ""
        if (scope, name) not in found:
            raise NotFound(f"secret {name!r} is gone")
        nonce, ciphertext = found[(scope, name)]
        out[variable] = secretbox.open_(key, nonce, ciphertext, tenant=scope, name=name).decode()
    return out
