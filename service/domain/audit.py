"""Recording writes: every write is signed with its caller, in the transaction that makes it."""

import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from service.auth.callers import Caller
from service.core import audit_chain
from service.db.driver import Conn
from service.db.engine import Database
from service.db.queries import audit as audit_q

log = structlog.get_logger(__name__)


async def record(
    conn: Conn,
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


@dataclass(frozen=True, slots=True)
class SealPass:
    sealed: int
    head: tuple[int, bytes] | None  # the head this pass sealed (None: it sealed nothing)
    foreign: list[int]  # ids of entries named as not written by a server


async def seal(db: Database, key: bytes, *, may_anchor: bool = True) -> SealPass:
    """Seal new entries into the keyed chain (the leader does this every pass); log the head.

    Entries without a server's signature are left out and named in the log. `may_anchor`:
    False once this server kept a head (it sealed keyed entries): a missing anchor is then
    tampering (audit_q.AnchorGone), never a first start.
    """
    total = 0
    chain, signing = audit_chain.chain_key(key), audit_chain.row_key(key)
    foreign: list[int] = []
    head: tuple[int, bytes] | None = None
    while True:
        async with db.driver() as conn:
            batch = await audit_q.seal_batch(
                conn, key=chain, row_key=signing, may_anchor=may_anchor
            )
        total += batch.count
        foreign += batch.foreign
        if batch.count:
            head = (batch.seq, batch.digest)
        if batch.foreign:
            log.warning(
                "audit_entries_not_signed",
                ids=batch.foreign[:50],
                count=len(batch.foreign),
                reason="not written by a berth server holding the key: left out of the chain",
            )
        if batch.count == 0 and not batch.foreign:
            return SealPass(total, head, foreign)
        if batch.count:
            # Recorded outside the database (the log, and the sealer's home): `audit verify`
            # checks a truncated or rewritten tail against it.
            log.info("audit_sealed", entries=batch.count, head=audit_chain.show_head(*head))  # type: ignore[misc]


@dataclass(frozen=True, slots=True)
class Verification:
    broken: str | None
    plain: int  # entries sealed before the chain was keyed
    keyed: int
    pending: int  # not yet sealed


async def verify(
    db: Database,
    key: bytes | None,
    *,
    heads: Sequence[tuple[int, bytes]] = (),
    recorded: tuple[int, bytes] | None = None,
) -> Verification:
    """Walk the chain under its key; the first break, and what was checked.

    `heads`: heads recorded elsewhere (--head); `recorded`: the head a server sealed and kept in
    its home. With one, a chain without its keyed anchor is a rewrite, never "sealed before
    keys".
    """
    chain = audit_chain.chain_key(key) if key is not None else None
    async with db.begin() as conn:
        found = await audit_q.anchor(conn)
        keyed_from = None
        if found is None and recorded is not None:
            return Verification(
                f"the chain's keyed anchor is gone, but this server sealed keyed entries up to "
                f"seq {recorded[0]} (its head in $BERTH_HOME/audit.head): the chain was rewritten",
                0,
                0,
                0,
            )
        if found is not None:
            keyed_from, mac = found
            if chain is None:
                return Verification(
                    "no secret key to verify the keyed entries (BERTH_SECRET_KEY or secret.key)",
                    0,
                    0,
                    0,
                )
            if not hmac.compare_digest(mac, audit_chain.anchor_mac(chain, keyed_from)):
                return Verification(
                    "the audit anchor was altered (or the secret key is not the server's)",
                    0,
                    0,
                    0,
                )
        all_heads = [*heads, *([recorded] if recorded is not None else [])]
        walker = audit_chain.Walker(key=chain, keyed_from=keyed_from, heads=all_heads)
        after = 0
        while batch := await audit_q.sealed(conn, after_seq=after, limit=5000):
            for entry in batch:
                if broken := walker.feed(entry):
                    return Verification(broken, walker.plain, walker.keyed, 0)
            after = batch[-1]["seq"]
        pending, unsigned, held_back = await _unsealed(conn, key)
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
    if broken is None and unsigned:
        broken = (
            f"{len(unsigned)} audit entries were not written by a berth server holding the key "
            f"(no valid signature), e.g. ids {', '.join(map(str, unsigned[:10]))}"
        )
    if broken is None and held_back:
        broken = (
            f"{len(held_back)} signed audit entries were kept out of the chain behind berth's "
            f"back, e.g. ids {', '.join(map(str, held_back[:10]))}"
        )
    return Verification(broken, walker.plain, walker.keyed, pending)


async def _unsealed(conn: AsyncConnection, key: bytes | None) -> tuple[int, list[int], list[int]]:
    """Entries outside the chain: (waiting to be sealed, unsigned, signed but marked unsigned).

    Without the key nothing can be told apart: all count as waiting.
    """
    signing = audit_chain.row_key(key) if key is not None else None
    pending, unsigned, held_back = 0, [], []
    after = 0
    while batch := await audit_q.unsealed(conn, after_id=after, limit=5000):
        for entry in batch:
            if signing is None:
                pending += 1
            elif not audit_chain.row_signed(signing, entry, entry["mac"]):
                unsigned.append(entry["id"])
            elif entry["hash"] is not None:
                held_back.append(entry["id"])
            else:
                pending += 1
        after = batch[-1]["id"]
    return pending, unsigned, held_back


async def head(db: Database) -> tuple[int, bytes] | None:
    async with db.begin() as conn:
        return await audit_q.head(conn)


async def recent(
    db: Database, caller: Caller, *, limit: int, match: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The newest entries the caller may see; `match` filters by caller, action, tenant, target."""
    async with db.begin() as conn:
        return await audit_q.recent(conn, tenants=caller.tenant_filter(), limit=limit, match=match)
