"""Secrets: set, list (names only), remove, and resolve the ones a job names for its lease.

The key: BERTH_SECRET_KEY (base64 of 32 bytes), else a key file in $BERTH_HOME created 0600 on
first use. Several servers sharing one Postgres must share the key (set BERTH_SECRET_KEY).
Values are never logged, never listed, and go to a worker only in a lease that names them.
"""

import base64
import binascii
import os
import secrets as stdlib_secrets
from collections.abc import Iterable, Mapping, Sequence
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


SYSTEM = ""  # no tenant: the shared worker credential, provider credentials; no job names it
ALL = "*"  # every tenant's (set with --all-tenants)


def owners(caller: Caller, tenants: Sequence[str], *, all_tenants: bool) -> list[str]:
    """Who a secret being set or removed belongs to: named tenants, every tenant, the system.

    Only an admin touches system secrets or shares one with every tenant; anyone else names
    tenants of its own (another's is as unknown as a missing one).
    """
    if all_tenants:
        if tenants:
            raise Invalid("name tenants or --all-tenants, not both")
        if not caller.all_tenants:
            raise Forbidden("only an admin shares a secret with every tenant")
        return [ALL]
    if not tenants:
        if not caller.all_tenants:
            raise Forbidden(
                "only an admin manages system secrets (no tenant); name your tenant (--tenant)"
            )
        return [SYSTEM]
    for tenant in tenants:
        check_name(tenant, "tenant")
        if not caller.sees(tenant):
            raise NotFound(f"no tenant {tenant!r}")
    return sorted(set(tenants))


def shown_owner(scope: str) -> str:
    return {SYSTEM: "system", ALL: "all tenants"}.get(scope, scope)


async def put(
    db: Database,
    key: bytes,
    caller: Caller,
    *,
    name: str,
    value: str,
    tenants: Sequence[str],
    all_tenants: bool = False,
    request_id: str = "",
) -> list[str]:
    """Set a secret for its owners (each its own row, sealed to its scope); returns them."""
    check_name(name, "secret name")
    if len(value.encode()) > MAX_VALUE:
        raise Invalid(f"a secret holds at most {MAX_VALUE} bytes")
    scopes = owners(caller, tenants, all_tenants=all_tenants)
    async with db.begin() as conn:
        for scope in scopes:
            nonce, ciphertext = secretbox.seal(key, value.encode(), tenant=scope, name=name)
            await secrets_q.put(
                conn, tenant=scope, name=name, nonce=nonce, ciphertext=ciphertext, by=str(caller)
            )
        await audit.record(
            conn,
            caller,
            "secret.set",
            name,
            tenant=scopes[0] if len(scopes) == 1 and scopes[0] not in (SYSTEM, ALL) else None,
            request_id=request_id,
            owners=[shown_owner(s) for s in scopes],
        )
    return scopes


async def names(db: Database, caller: Caller) -> list[dict[str, Any]]:
    """What the caller may see: its tenants' secrets and those shared with every tenant.

    An admin sees every one, system secrets included; nobody else learns their names.
    """
    filter_ = caller.tenant_filter()
    async with db.begin() as conn:
        rows = await secrets_q.names(conn, tenants=None if filter_ is None else {*filter_, ALL})
    return [{**r, "owner": shown_owner(r["tenant"])} for r in rows]


async def remove(
    db: Database,
    caller: Caller,
    *,
    name: str,
    tenants: Sequence[str],
    all_tenants: bool = False,
    request_id: str = "",
) -> None:
    scopes = owners(caller, tenants, all_tenants=all_tenants)
    async with db.begin() as conn:
        for scope in scopes:
            if not await secrets_q.remove(conn, tenant=scope, name=name):
                raise NotFound(f"no secret {name!r} of {shown_owner(scope)}")
        await audit.record(
            conn,
            caller,
            "secret.removed",
            name,
            tenant=scopes[0] if len(scopes) == 1 and scopes[0] not in (SYSTEM, ALL) else None,
            request_id=request_id,
            owners=[shown_owner(s) for s in scopes],
        )


def _missing(name: str, tenant: str) -> NotFound:
    # Security: the same words whether the secret does not exist or the job may not use it
    # (a system secret, another tenant's): a job learns nothing of secrets it cannot name.
    # A 404 as for an input blob the tenant does not hold (the submit's document says so).
    return NotFound(f"no secret {name!r} for tenant {tenant!r}")


async def check_exist(db: Database, *, tenant: str, names: Iterable[str]) -> None:
    """NotFound naming the first secret jobs ask for that their tenant may not use."""
    wanted = sorted(set(names))
    async with db.begin() as conn:
        found = await secrets_q.sealed_for(conn, scopes=(tenant, ALL), names_=wanted)
    for name in wanted:
        if (tenant, name) not in found and (ALL, name) not in found:
            raise _missing(name, tenant)


async def for_lease(
    db: Database, key: bytes, *, tenant: str, wanted: Mapping[str, str]
) -> dict[str, str]:
    """Variable -> value for a job's lease: the tenant's own secret, else one of every tenant.

    Never a system secret. NotFound (as at submit) for a secret gone since.
    """
    if not wanted:
        return {}
    async with db.begin() as conn:
        found = await secrets_q.sealed_for(
            conn, scopes=(tenant, ALL), names_=sorted(set(wanted.values()))
        )
    out = {}
    for variable, name in wanted.items():
        scope = tenant if (tenant, name) in found else ALL
        if (scope, name) not in found:
            raise _missing(name, tenant)
        nonce, ciphertext = found[(scope, name)]
        out[variable] = secretbox.open_(key, nonce, ciphertext, tenant=scope, name=name).decode()
    return out


async def system_value(db: Database, key: bytes, name: str) -> str:
    """A system secret's value (the shared worker credential): for the server's own use only."""
    async with db.begin() as conn:
        found = await secrets_q.sealed_for(conn, scopes=(SYSTEM,), names_=[name])
    if (SYSTEM, name) not in found:
        raise NotFound(
            f"no system secret {name!r} (set it with `berth secret set` and no --tenant)"
        )
    nonce, ciphertext = found[(SYSTEM, name)]
    return secretbox.open_(key, nonce, ciphertext, tenant=SYSTEM, name=name).decode()
