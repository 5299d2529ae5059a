"""Joining a node (SPEC section 2): one-time join tokens, traded for a credential of its own.

The join token binds the pool, labels, tenants and name: the server decides them, not the
worker. At its first attach the worker spends it (one use, ever) for a worker token bound the
same way, which it keeps 0600 in its state directory. That credential is rotated over the
socket in two phases: the next one is valid from the moment it is sent, and replaces the old one
once the worker confirms it stored it.
"""

import re
import secrets as stdlib_secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.auth import minting
from service.auth import tokens as tokens_auth
from service.auth.callers import Caller
from service.core.errors import Conflict, Forbidden, Invalid, NotFound
from service.core.placement import PoolSpec
from service.core.states import TokenKind
from service.db.engine import Database
from service.db.queries import jobs as jobs_q
from service.db.queries import joining as joining_q
from service.db.queries import tokens as tokens_q
from service.db.queries import workers as workers_q
from service.domain import audit
from service.domain.tokens import caller_of, check_name, check_worker_name

PREFIX = "brj_"
LABEL = re.compile(r"\A[^,\x00-\x1f\x7f]{1,256}\Z")
CREDENTIAL_DAYS = 3650  # it rotates far sooner; revocation ends it at once


def looks_like(token: str) -> bool:
    return token.startswith(PREFIX) and len(token) > len(PREFIX) + 20


@dataclass(frozen=True, slots=True)
class Issued:
    token: str  # shown once
    name: str
    pool: str
    labels: tuple[str, ...]
    tenants: tuple[str, ...]
    expires_at: datetime


def worker_name(pool: str) -> str:
    """A generated name for a node: its pool and 8 random hex digits."""
    return f"{pool}-{stdlib_secrets.token_hex(4)}"[:128]


async def create(
    conn: AsyncConnection,
    *,
    name: str,
    pool: str,
    labels: Sequence[str],
    tenants: Sequence[str],
    by: str,
    expires_seconds: float,
) -> tuple[str, dict[str, Any]]:
    """Mint a join token and store its digest, in the caller's transaction: (token, row)."""
    token = PREFIX + stdlib_secrets.token_urlsafe(32)
    row = await joining_q.create(
        conn,
        digest=tokens_auth.digest(token),
        name=name,
        pool=pool,
        labels=sorted(set(labels)),
        tenants=sorted(set(tenants)),
        created_by=by,
        expires_seconds=expires_seconds,
    )
    return token, row


async def issue(
    db: Database,
    caller: Caller,
    *,
    pool: str,
    name: str | None,
    labels: Sequence[str],
    tenants: Sequence[str],
    expires_seconds: float,
    pools: Mapping[str, PoolSpec],
    request_id: str = "",
) -> Issued:
    """A one-time join token for a node of `pool`.

    Forbidden when the caller may not mint the worker credential it stands for (SPEC: who may
    mint what).
    """
    if pool not in pools:
        raise NotFound(f"unknown pool {pool!r}; configured: {', '.join(sorted(pools))}")
    name = check_worker_name(name) if name else worker_name(pool)
    for label in labels:
        if not LABEL.match(label):
            raise Invalid(f"label {label!r} must be 1-256 characters without commas")
    for tenant in tenants:
        check_name(tenant, "tenant")
    if not 0 < expires_seconds <= 30 * 86400:
        raise Invalid("a join token expires within 30 days")
    minting.check(caller, TokenKind.WORKER, tenants)
    async with db.begin() as conn:
        if await joining_q.name_taken(conn, name) or await workers_q.holds_leases(conn, name=name):
            raise Conflict(f"a worker (or a pending join token) named {name!r} exists")
        await jobs_q.ensure_tenants(conn, list(tenants))
        token, row = await create(
            conn,
            name=name,
            pool=pool,
            labels=labels,
            tenants=tenants,
            by=str(caller),
            expires_seconds=expires_seconds,
        )
        await audit.record(
            conn, caller, "join_token.created", name, request_id=request_id, pool=pool
        )
    return Issued(
        token=token,
        name=name,
        pool=pool,
        labels=tuple(sorted(set(labels))),
        tenants=tuple(sorted(set(tenants))),
        expires_at=row["expires_at"],
    )


class JoinRefused(Forbidden):
    """The join token cannot be used; the message says why (spent, expired, unknown)."""


async def trade(db: Database, token: str) -> tuple[Caller, str]:
    """Spend a join token for the worker's own credential: (its caller, the credential)."""
    digest = tokens_auth.digest(token)
    credential = tokens_auth.mint()
    async with db.begin() as conn:
        spent = await joining_q.spend(conn, digest)
        if spent is None:
            reason = await joining_q.why_unusable(conn, digest)
        else:
            record = await tokens_q.create(
                conn,
                name=spent["name"],
                kind=str(TokenKind.WORKER),
                digest=tokens_auth.digest(credential),
                tenants=list(spent["tenants"]),
                created_by=spent["created_by"],
                expires_days=CREDENTIAL_DAYS,
                pool=spent["pool"],
                labels=list(spent["labels"]),
            )
            await audit.record(
                conn, f"worker:{record.name}", "worker.joined", record.name, pool=record.pool
            )
    if spent is None:
        raise JoinRefused(reason)
    return caller_of(record), credential


async def rotation_due(db: Database, name: str, *, hours: float) -> float | None:
    """Seconds until the worker `name`'s credential rotates (<= 0: now); None: it does not."""
    async with db.driver() as conn:
        return await tokens_q.rotation_due(conn, name=name, hours=hours)


async def begin_rotation(db: Database, name: str) -> str | None:
    """The next credential for `name`, valid at once beside the old; None when it is gone."""
    credential = tokens_auth.mint()
    async with db.begin() as conn:
        if not await tokens_q.begin_rotation(
            conn, name=name, digest=tokens_auth.digest(credential)
        ):
            return None
    return credential


async def finish_rotation(db: Database, name: str) -> bool:
    """The worker stored the next credential: it replaces the old one, which is refused now."""
    async with db.begin() as conn:
        done = await tokens_q.finish_rotation(conn, name=name)
        if done:
            # Every server drops the old credential from its cache of callers.
            await workers_q.notify(conn, {"op": "rotated", "worker": name})
            await audit.record(conn, f"worker:{name}", "worker.credential_rotated", name)
    return done
