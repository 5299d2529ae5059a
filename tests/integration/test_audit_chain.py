"""The keyed audit chain on a real database: sealing, verifying, and what a database writer
without the secret key cannot hide."""

from typing import Any

from sqlalchemy import text

from service.core import audit_chain
from service.db.engine import Database
from service.db.queries import audit as audit_q
from service.domain import audit

KEY = b"s" * 32


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
        assert await audit.seal(db, KEY) == 5
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
        broken = (await audit.verify(db, KEY, head=head)).broken
        assert broken is not None and "newest 2 entries were deleted" in broken
        forged = (head[0] - 2, b"\x00" * 32)
        assert "not the recorded head" in ((await audit.verify(db, KEY, head=forged)).broken or "")


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
        assert await audit.seal(db, KEY) == 2
        result = await audit.verify(db, KEY)
        assert (result.broken, result.plain, result.keyed) == (None, 3, 2)
        async with db.begin() as conn:
            assert await audit_q.anchor(conn) is not None
            await conn.execute(text("UPDATE audit SET target = 'x' WHERE seq = 1"))
        assert "seq 1" in ((await audit.verify(db, KEY)).broken or "")
