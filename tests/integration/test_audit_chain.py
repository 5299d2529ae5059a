"""The keyed audit chain on a real database: sealing, verifying, and what a database writer
without the secret key cannot hide."""

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text

from service.core import audit_chain
from service.db.engine import Database
from service.db.queries import audit as audit_q
from service.domain import audit

KEY = b"s" * 32


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    """The database as a server holding KEY writes to it: every entry signed on insert."""
    database = Database(db_url, secret_key=KEY)
    yield database
    await database.dispose()


async def write(db: Database, n: int, action: str = "job.submitted") -> None:
    async with db.begin() as conn:
        for i in range(n):
            await audit.record(conn, "human:ada", action, f"target-{i}")


async def entries(db: Database) -> list[dict[str, Any]]:
    async with db.begin() as conn:
        return await audit_q.sealed(conn, after_seq=0, limit=10_000)


async def rewrite_plain(db: Database, start: int) -> None:
    """What a writer with database access alone can do: recompute plain SHA-256 links."""
    rows = await entries(db)
    previous = audit_chain.GENESIS if start == 1 else rows[start - 2]["hash"]
    async with db.begin() as conn:
        for row in rows[start - 1 :]:
            previous = audit_chain.link(previous, row["seq"], row)  # no key: plain SHA-256
            await conn.execute(
                text("UPDATE audit SET hash = :h WHERE seq = :s"), {"h": previous, "s": row["seq"]}
            )


class TestKeyedChain:
    async def test_seals_and_verifies(self, db: Database):
        """A keyed server seals every entry; verify with the same key finds them intact."""
        await write(db, 5)
        assert (await audit.seal(db, KEY)).sealed == 5
        result = await audit.verify(db, KEY)
        assert (result.broken, result.keyed, result.plain, result.pending) == (None, 5, 0, 0)

    async def test_edit_then_plain_recompute_is_detected(self, db: Database):
        """An UPDATE followed by recomputing the unkeyed chain breaks at the edited entry."""
        await write(db, 5)
        await audit.seal(db, KEY)
        async with db.begin() as conn:
            await conn.execute(text("UPDATE audit SET caller = 'human:mallory' WHERE seq = 3"))
        await rewrite_plain(db, 3)
        result = await audit.verify(db, KEY)
        assert result.broken is not None and "seq 3" in result.broken

    async def test_whole_chain_rewritten_and_anchor_deleted_is_detected(self, db: Database):
        """Rewriting every link as plain SHA-256 and deleting the anchor does not pass."""
        await write(db, 4)
        await audit.seal(db, KEY)
        async with db.begin() as conn:
            await conn.execute(text("UPDATE audit SET target = 'nothing' WHERE seq = 2"))
            await conn.execute(text("DELETE FROM audit_anchor"))
        await rewrite_plain(db, 1)
        result = await audit.verify(db, KEY)
        assert result.broken is not None and "no keyed anchor" in result.broken

    async def test_moved_anchor_is_detected(self, db: Database):
        """Moving the keyed boundary (to pass keyed entries off as plain) breaks its MAC."""
        await write(db, 3)
        await audit.seal(db, KEY)
        async with db.begin() as conn:
            await conn.execute(text("UPDATE audit_anchor SET keyed_from = 3"))
        result = await audit.verify(db, KEY)
        assert result.broken is not None and "anchor was altered" in result.broken

    async def test_wrong_or_missing_key(self, db: Database):
        """Verifying with another key, or none, fails and says why."""
        await write(db, 2)
        await audit.seal(db, KEY)
        assert "anchor was altered" in ((await audit.verify(db, b"x" * 32)).broken or "")
        assert "no secret key" in ((await audit.verify(db, None)).broken or "")

    async def test_truncated_tail_against_a_recorded_head(self, db: Database):
        """Deleting the newest entries leaves a valid chain; a recorded head shows the loss."""
        await write(db, 6)
        await audit.seal(db, KEY)
        head = await audit.head(db)
        assert head is not None and head[0] == 6
        async with db.begin() as conn:
            await conn.execute(text("DELETE FROM audit WHERE seq > 4"))
        assert (await audit.verify(db, KEY)).broken is None  # alone, it cannot tell
        broken = (await audit.verify(db, KEY, heads=[head])).broken
        assert broken is not None and "newest 2 entries were deleted" in broken
        forged = (head[0] - 2, b"\x00" * 32)
        assert "not the recorded head" in (
            (await audit.verify(db, KEY, heads=[forged])).broken or ""
        )


class TestOldEntries:
    async def test_entries_sealed_before_the_key_verify_plain(self, db: Database):
        """Entries a pre-key server sealed (plain SHA-256) still verify; new ones are keyed."""
        await write(db, 3, action="old.write")
        async with db.begin() as conn:  # seal the way the old server did: plain links
            previous = audit_chain.GENESIS
            rows = (await conn.execute(text("SELECT * FROM audit ORDER BY id"))).mappings().all()
            for seq, row in enumerate(rows, start=1):
                previous = audit_chain.link(previous, seq, row)
                await conn.execute(
                    text("UPDATE audit SET seq = :s, hash = :h WHERE id = :i"),
                    {"s": seq, "h": previous, "i": row["id"]},
                )
        await write(db, 2, action="new.write")
        assert (await audit.seal(db, KEY)).sealed == 2
        result = await audit.verify(db, KEY)
        assert (result.broken, result.plain, result.keyed) == (None, 3, 2)
        async with db.begin() as conn:
            assert await audit_q.anchor(conn) is not None
            await conn.execute(text("UPDATE audit SET target = 'x' WHERE seq = 1"))
        assert "seq 1" in ((await audit.verify(db, KEY)).broken or "")


class TestADatabaseWriterWithoutTheKey:
    async def test_an_entry_it_inserts_is_never_sealed_and_is_named(self, db: Database):
        """A row inserted straight into the table (no server's signature) stays out of the
        chain, the sealer names it, and verify fails naming it."""
        await write(db, 2)
        async with db.begin() as conn:
            forged = (
                await conn.execute(
                    text(
                        "INSERT INTO audit (caller, action, target) "
                        "VALUES ('human:admin', 'token.revoked', 'mallory') RETURNING id"
                    )
                )
            ).scalar_one()
        await write(db, 1)
        done = await audit.seal(db, KEY)
        assert (done.sealed, done.foreign) == (3, [forged])
        assert (await audit.seal(db, KEY)).foreign == []  # named once, then left alone
        result = await audit.verify(db, KEY)
        assert result.broken is not None and str(forged) in result.broken
        assert "not written by a berth server" in result.broken

    async def test_an_entry_edited_before_sealing_is_named(self, db: Database):
        """Editing a server's entry before the sealer reaches it voids its signature."""
        await write(db, 3)
        async with db.begin() as conn:
            edited = (
                await conn.execute(
                    text(
                        "UPDATE audit SET target = 'someone-else' "
                        "WHERE id = (SELECT min(id) FROM audit) RETURNING id"
                    )
                )
            ).scalar_one()
        done = await audit.seal(db, KEY)
        assert (done.sealed, done.foreign) == (2, [edited])

    async def test_a_signed_entry_kept_out_of_the_chain_is_named(self, db: Database):
        """Marking a server's entry as unsigned (to keep it out of the chain) is caught."""
        await write(db, 2)
        async with db.begin() as conn:
            await conn.execute(text("UPDATE audit SET hash = '' WHERE seq IS NULL"))
        assert (await audit.seal(db, KEY)).sealed == 0
        broken = (await audit.verify(db, KEY)).broken
        assert broken is not None and "kept out of the chain" in broken

    async def test_a_signature_cannot_be_copied(self, db: Database):
        """A copy of a signed entry (its signature replayed) is refused by the database."""
        await write(db, 1)
        async with db.begin() as conn:
            with pytest.raises(Exception, match="uq_audit_mac"):
                await conn.execute(
                    text(
                        "INSERT INTO audit (caller, action, target, mac) "
                        "SELECT caller, action, target, mac FROM audit"
                    )
                )

    async def test_an_unkeyed_rewrite_fails_against_the_kept_head(self, db: Database):
        """With the head a server kept, a chain whose anchor is gone is a rewrite, whatever it
        holds, and a rewritten or truncated tail is caught with no flags."""
        await write(db, 4)
        sealed = await audit.seal(db, KEY)
        assert sealed.head is not None
        async with db.begin() as conn:
            await conn.execute(text("DELETE FROM audit_anchor"))
        await rewrite_plain(db, 1)
        broken = (await audit.verify(db, KEY, recorded=sealed.head)).broken
        assert broken is not None and "anchor is gone" in broken
