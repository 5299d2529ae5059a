"""Recording writes: every write is signed with its caller, in the transaction that makes it."""

import hmac
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from service.auth.callers import Caller
from service.core import audit_chain
from service.db.engine import Database
from service.db.queries import audit as audit_q

log = structlog.get_logger(__name__)


async def record(
    conn: AsyncConnection,
    caller: Caller | str,
    action: str,
    target: str,
    *,
    tenant: str | None = None,
    request_id: str = "",
    **detail: Any,  # noqa: ANN401  (JSON-able details, stored as jsonb)
) -> None:
    if isinstance(caller, Caller) and caller.on_behalf:
        detail = {**detail, "on_behalf_of": caller.on_behalf}
    await audit_q.append(
        conn,
        [
            {
                "caller": str(caller),
                "action": action,
                "target": target[:256],  # the column's width: a long target is cut, not refused
                "tenant": tenant,
                "request_id": request_id,
                "detail": detail,
            }
        ],
    )


async def seal(db: Database, key: bytes) -> int:
    """Seal new entries into the keyed chain (the leader does this every pass); log the head."""
    total = 0
    chain = audit_chain.chain_key(key)
    while True:
        async with db.begin() as conn:
            n, seq, digest = await audit_q.seal_batch(conn, key=chain)
        total += n
        if n == 0:
            return total
        # Recorded outside the database (the log): `audit verify --head` checks a truncated
        # tail against it.
        log.info("audit_sealed", entries=n, head=audit_chain.show_head(seq, digest))


@dataclass(frozen=True, slots=True)
class Verification:
    broken: str | None
    plain: int  # entries sealed before the chain was keyed
    keyed: int
    pending: int  # not yet sealed


async def verify(
    db: Database, key: bytes | None, *, head: tuple[int, bytes] | None = None
) -> Verification:
    """Walk the chain under its key; the first break, and what was checked."""
    chain = audit_chain.chain_key(key) if key is not None else None
    async with db.begin() as conn:
        pending = await audit_q.unsealed_count(conn)
        found = await audit_q.anchor(conn)
        keyed_from = None
        if found is not None:
            keyed_from, mac = found
            if chain is None:
                return Verification(
                    "no secret key to verify the keyed entries (BERTH_SECRET_KEY or secret.key)",
                    0,
                    0,
                    pending,
                )
            if not hmac.compare_digest(mac, audit_chain.anchor_mac(chain, keyed_from)):
                return Verification(
                    "the audit anchor was altered (or the secret key is not the server's)",
                    0,
                    0,
                    pending,
                )
        walker = audit_chain.Walker(key=chain, keyed_from=keyed_from, head=head)
        after = 0
        while batch := await audit_q.sealed(conn, after_seq=after, limit=5000):
            for entry in batch:
                if broken := walker.feed(entry):
                    return Verification(broken, walker.plain, walker.keyed, pending)
            after = batch[-1]["seq"]
    broken = walker.finish()
    if broken is None and found is None and walker.plain:
        # Every server writes the anchor on its first sealing pass: sealed entries without one
        # means no server ran since the upgrade, or the anchor was deleted to pass a rewritten
        # chain off as plain SHA-256.
        broken = (
            "the chain has no keyed anchor: either no berth server has run since `berth db "
            "upgrade`, or the anchor was deleted and the chain rewritten; start the server "
            "once, or check against a recorded head (--head)"
        )
    return Verification(broken, walker.plain, walker.keyed, pending)


async def head(db: Database) -> tuple[int, bytes] | None:
    async with db.begin() as conn:
        return await audit_q.head(conn)


async def recent(db: Database, caller: Caller, *, limit: int) -> list[dict[str, Any]]:
    async with db.begin() as conn:
        return await audit_q.recent(conn, tenants=caller.tenant_filter(), limit=limit)
