"""Reports from workers on a real database: a report the database refuses costs only itself,
a resent report is kept once, and a given-back lease re-queues its job at once."""

import uuid

from sqlalchemy import text

from service import protocol
from service.db.engine import Database
from service.db.queries import workers as workers_q
from service.db.records import WorkerRecord
from service.domain import reports

POISON = b"POISON"


async def worker(db: Database) -> WorkerRecord:
    async with db.begin() as conn:
        record = await workers_q.attach(
            conn,
            name=f"w-{uuid.uuid4().hex[:6]}",
            identity="token:1",
            pool="gpu",
            instance="i",
            server_id="s",
            labels=[],
            tenants=[],
            parallel=0,
            host={},
            python="",
            env_digest="",
            version="",
        )
    assert record is not None
    return record


async def leased_jobs(db: Database, w: WorkerRecord, n: int) -> list[int]:
    """n jobs leased to `w` at epoch 1."""
    async with db.begin() as conn:
        rows = await conn.execute(
            text(
                "INSERT INTO jobs (tenant, pool, command, created_by, state, attempt, worker) "
                "SELECT 'default', 'gpu', ARRAY['true'], 'test', 'leased', 1, :name "
                "FROM generate_series(1, :n) RETURNING id"
            ),
            {"n": n, "name": w.name},
        )
        ids = [r[0] for r in rows]
        await conn.execute(
            text(
                "INSERT INTO leases (job_id, epoch, worker_id, kind) "
                "SELECT unnest(CAST(:ids AS bigint[])), 1, :w, 'default'"
            ),
            {"ids": ids, "w": w.id},
        )
    return ids


async def poison_output(db: Database) -> None:
    """Fault injection: the database refuses one particular output row, as it would any row
    it cannot store."""
    async with db.begin() as conn:
        await conn.execute(
            text(
                """
                CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.data = 'POISON'::bytea THEN RAISE EXCEPTION 'poisoned row'; END IF;
                    RETURN NEW;
                END $$
                """
            )
        )
        await conn.execute(
            text(
                "CREATE TRIGGER refuse_poison BEFORE INSERT ON job_output "
                "FOR EACH ROW EXECUTE FUNCTION refuse_poison()"
            )
        )


async def outputs(db: Database, job: int) -> list[bytes]:
    async with db.begin() as conn:
        rows = await conn.execute(
            text("SELECT data FROM job_output WHERE job_id = :j ORDER BY id"), {"j": job}
        )
        return [r[0] for r in rows]


async def state(db: Database, job: int) -> tuple[str, int, str]:
    async with db.begin() as conn:
        row = (
            await conn.execute(
                text("SELECT state, attempt, error FROM jobs WHERE id = :j"), {"j": job}
            )
        ).one()
    return row.state, row.attempt, row.error


def out(seq: int, job: int, data: bytes) -> protocol.Output:
    return protocol.Output(seq=seq, job=job, epoch=1, stream="stdout", data=data)


class TestIsolation:
    async def test_a_refused_report_costs_only_itself(self, db: Database):
        """One output the database refuses, in a batch from two workers: every other report of
        the batch is applied, and the batch is answered whole."""
        await poison_output(db)
        w1, w2 = await worker(db), await worker(db)
        (a,), (b,) = await leased_jobs(db, w1, 1), await leased_jobs(db, w2, 1)
        batch = reports.Reports()
        batch.add(w1, protocol.Started(seq=1, job=a, epoch=1))
        batch.add(w1, out(2, a, b"good-a\n"))
        batch.add(w2, out(1, b, POISON))
        batch.add(w2, out(2, b, b"good-b\n"))
        batch.add(w1, protocol.Finished(seq=3, job=a, epoch=1, state="succeeded", exit_code=0))
        verdicts = await reports.apply(db, batch)
        assert verdicts.stale == set()
        assert await outputs(db, a) == [b"good-a\n"]
        assert await outputs(db, b) == [b"good-b\n"]
        assert (await state(db, a))[0] == "succeeded"

    async def test_a_result_the_database_refuses_still_ends_the_job(self, db: Database):
        """A result that cannot be stored ends its job as failed, saying so, instead of leaving
        it running forever."""
        await poison_output(db)
        async with db.begin() as conn:
            await conn.execute(
                text(
                    """
                    CREATE FUNCTION refuse_poison_result() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN
                        IF NEW.error = 'POISON' THEN RAISE EXCEPTION 'poisoned result'; END IF;
                        RETURN NEW;
                    END $$
                    """
                )
            )
            await conn.execute(
                text(
                    "CREATE TRIGGER refuse_poison_result BEFORE UPDATE ON jobs "
                    "FOR EACH ROW EXECUTE FUNCTION refuse_poison_result()"
                )
            )
        w = await worker(db)
        (a,) = await leased_jobs(db, w, 1)
        batch = reports.Reports()
        batch.add(w, protocol.Finished(seq=1, job=a, epoch=1, state="failed", error="POISON"))
        await reports.apply(db, batch)
        st, _, error = await state(db, a)
        assert st == "failed" and "could not be stored" in error

    async def test_nul_in_error_text_is_stored_visibly(self, db: Database):
        """Free text a worker sends (an error) is made storable, not refused."""
        w = await worker(db)
        (a,) = await leased_jobs(db, w, 1)
        batch = reports.Reports()
        batch.add(w, protocol.Finished(seq=1, job=a, epoch=1, state="failed", error="bad\x00x"))
        await reports.apply(db, batch)
        assert await state(db, a) == ("failed", 1, "bad\ufffdx")


class TestResend:
    async def test_resent_output_is_kept_once(self, db: Database):
        """The same (job, epoch, seq) applied twice (a resend after a reconnect) is kept once."""
        w = await worker(db)
        (a,) = await leased_jobs(db, w, 1)
        for _ in range(2):
            batch = reports.Reports()
            batch.add(w, out(1, a, b"\x00binary\xff"))
            batch.add(w, out(2, a, b"more"))
            await reports.apply(db, batch)
        assert await outputs(db, a) == [b"\x00binary\xff", b"more"]

    async def test_given_back_lease_requeues_at_once(self, db: Database):
        """gave_back expires the live lease and re-queues the job (attempt kept, next +1)."""
        w = await worker(db)
        (a,) = await leased_jobs(db, w, 1)
        batch = reports.Reports()
        batch.add(w, protocol.GaveBack(seq=1, job=a, epoch=1, reason="no ack"))
        verdicts = await reports.apply(db, batch)
        assert verdicts.requeued == 1
        assert (await state(db, a))[:2] == ("queued", 1)
        again = await reports.apply(db, batch)  # a resend changes nothing
        assert again.requeued == 0 and (await state(db, a))[:2] == ("queued", 1)


class TestMetrics:
    async def test_several_metrics_reports_in_one_batch_all_count(self, db: Database):
        """Three metrics reports for one job in one flush: every name is kept, the newest value
        of a name wins, whatever order the database would pick rows in."""
        w = await worker(db)
        (a,) = await leased_jobs(db, w, 1)
        batch = reports.Reports()
        batch.add(w, protocol.Metrics(seq=1, job=a, epoch=1, values={"loss": 0.9, "step": 1}))
        batch.add(w, protocol.Metrics(seq=2, job=a, epoch=1, values={"acc": 0.5}))
        batch.add(w, protocol.Metrics(seq=3, job=a, epoch=1, values={"loss": 0.4, "step": 2}))
        await reports.apply(db, batch)
        async with db.begin() as conn:
            row = await conn.execute(text("SELECT metrics FROM jobs WHERE id = :a"), {"a": a})
            assert row.scalar_one() == {"loss": 0.4, "step": 2, "acc": 0.5}
