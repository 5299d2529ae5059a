"""Workers' reports (started, output, finished, gave_back), applied in batches, never lost.

Every report is fenced: it counts only while (job, epoch, worker) is the live lease; a report
refused as stale tells the worker to kill that copy. A batch is one transaction. When the
database refuses the batch for a reason other than being away (a report it cannot store), the
batch is applied again one report per transaction, so the bad report costs only itself: it is
logged, and a result that cannot be stored still ends its job (failed, with the reason).
"""

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import asyncpg
import msgspec
import structlog
from sqlalchemy.exc import DBAPIError

from service import protocol
from service.config import Config
from service.core import bounds
from service.core.errors import BerthError, Unavailable
from service.db.driver import Conn
from service.db.engine import Database
from service.db.queries import jobs as jobs_q
from service.db.queries import reports as reports_q
from service.db.records import WorkerRecord
from service.domain.artifacts import references, room

log = structlog.get_logger(__name__)

MAX_ERROR = 2000
# Kinds of report in the order a batch applies them: a job's metrics and saved artifacts are
# kept before its result ends the lease they are fenced by.
KINDS = ("started", "output", "metrics", "saved", "finished", "gave_back")


def clean_text(value: str, limit: int = MAX_ERROR) -> str:
    """Free text a worker sent, made storable: Postgres text holds no NUL; cut to `limit`."""
    return value.replace("\x00", "\ufffd")[:limit]


@dataclass
class Reports:
    """What one flush collected from the workers attached here, in arrival order per kind."""

    started: list[tuple[WorkerRecord, protocol.Started]] = field(default_factory=list)
    output: list[tuple[WorkerRecord, protocol.Output]] = field(default_factory=list)
    finished: list[tuple[WorkerRecord, protocol.Finished]] = field(default_factory=list)
    gave_back: list[tuple[WorkerRecord, protocol.GaveBack]] = field(default_factory=list)
    metrics: list[tuple[WorkerRecord, protocol.Metrics]] = field(default_factory=list)
    saved: list[tuple[WorkerRecord, protocol.Saved]] = field(default_factory=list)

    def __len__(self) -> int:
        return sum(len(getattr(self, kind)) for kind in KINDS)

    def add(self, worker: WorkerRecord, report: protocol.Report) -> None:
        match report:
            case protocol.Started():
                self.started.append((worker, report))
            case protocol.Output():
                self.output.append((worker, report))
            case protocol.Finished():
                self.finished.append((worker, report))
            case protocol.GaveBack():
                self.gave_back.append((worker, report))
            case protocol.Metrics():
                self.metrics.append((worker, report))
            case protocol.Saved():
                self.saved.append((worker, report))

    def extend(self, other: "Reports") -> None:
        """Append `other` after these (a batch kept for retry, then newer reports)."""
        for kind in KINDS:
            getattr(self, kind).extend(getattr(other, kind))

    def singles(self) -> Iterator["Reports"]:
        """Each report as a batch of its own, kinds in the order a batch applies them."""
        for kind in KINDS:
            for item in getattr(self, kind):
                one = Reports()
                getattr(one, kind).append(item)
                yield one


@dataclass(frozen=True, slots=True)
class Verdicts:
    stale: set[tuple[str, int, int]] = field(default_factory=set)  # (worker id, job, epoch)
    requeued: int = 0  # jobs whose lease ended here: slots freed, jobs back in the queue

    def merge(self, other: "Verdicts") -> "Verdicts":
        return Verdicts(self.stale | other.stale, self.requeued + other.requeued)


# What the database (or berth's own check) says of a report it will not take: a statement that
# failed, a conflict. Anything else is a bug in berth, not in a report, and is not isolated.
REFUSED = (BerthError, DBAPIError, asyncpg.PostgresError)


async def apply(db: Database, batch: Reports, *, in_force: Config | None = None) -> Verdicts:
    """Apply a batch; raise Unavailable (keep the batch, retry) when the database is away.

    With `in_force` (berth.toml with the limits), outputs and saves that would take a tenant
    past its max_stored_gb are not kept, and a result whose outputs were not says why.
    """
    try:
        async with db.driver() as conn:
            return await _apply(conn, batch, in_force)
    except Unavailable:
        raise
    except REFUSED as exc:  # a report the database refuses: isolate it, keep the rest
        log.warning("report_batch_refused", error=repr(exc), reports=len(batch))
    verdicts = Verdicts()
    for one in batch.singles():
        try:
            async with db.driver() as conn:
                verdicts = verdicts.merge(await _apply(conn, one, in_force))
        except Unavailable:
            raise  # what was applied stays; a retry applies it again harmlessly
        except REFUSED as exc:
            verdicts = verdicts.merge(await _reject(db, one, exc))
    return verdicts


async def _reject(
    db: Database, one: Reports, exc: BerthError | DBAPIError | asyncpg.PostgresError
) -> Verdicts:
    """A report the database refused on its own: log it; a result still ends its job."""
    log.error("report_refused", error=repr(exc), report=_describe(one))
    if not one.finished:
        return Verdicts()
    worker, f = one.finished[0]
    stand_in = protocol.Finished(
        seq=f.seq,
        job=f.job,
        epoch=f.epoch,
        state="failed",
        exit_code=f.exit_code,
        error="the worker's result could not be stored; see the server log",
    )
    async with db.driver() as conn:
        return await _apply(conn, Reports(finished=[(worker, stand_in)]), None)


def _describe(one: Reports) -> str:
    for kind in KINDS:
        for worker, report in getattr(one, kind):
            return f"{kind} job {report.job} epoch {report.epoch} from {worker.name}"
    return "nothing"


async def _apply(conn: Conn, batch: Reports, in_force: Config | None) -> Verdicts:
    results = batch.finished
    if in_force is not None:
        results = await _outputs_within_bounds(conn, results, in_force)
    ending = {(f.job, f.epoch) for _, f in results}
    # A job that also finishes in this flush skips 'running': finish sets started_at itself.
    started = await reports_q.start_many(
        conn, [(f.job, f.epoch, w.id) for w, f in batch.started if (f.job, f.epoch) not in ending]
    )
    output = await reports_q.output_many(
        conn, [(o.job, o.epoch, w.id, o.seq, o.stream, o.data) for w, o in batch.output]
    )
    await _keep_metrics_and_saved(conn, batch, in_force)
    finished = await reports_q.finish_many(
        conn,
        [
            (f.job, f.epoch, w.id, w.name, f.state, f.exit_code, clean_text(f.error))
            for w, f in results
        ],
    )
    await _keep_outputs(
        conn, [(w, f) for w, f in results if (f.job, f.epoch) in finished], finished
    )
    refused = [(f.job, f.epoch, w.id) for w, f in results if (f.job, f.epoch) not in finished]
    resent = await reports_q.already_finished(conn, refused)
    given = await reports_q.give_back_many(
        conn, [(g.job, g.epoch, w.id) for w, g in batch.gave_back]
    )
    if given:
        await jobs_q.notify_jobs(conn)
    stale: set[tuple[str, int, int]] = set()
    for w, s in batch.started:
        key = (s.job, s.epoch)
        if key not in started and (key not in ending or key not in finished):
            stale.add((w.id, s.job, s.epoch))
    for w, o in batch.output:
        if (o.job, o.epoch) not in output:
            stale.add((w.id, o.job, o.epoch))
    for w, f in results:
        if (f.job, f.epoch) not in finished and (f.job, f.epoch) not in resent:
            stale.add((w.id, f.job, f.epoch))
    for worker_id, job, epoch in stale:
        log.warning("report_refused_stale_epoch", worker_id=worker_id, job=job, epoch=epoch)
    for _, g in batch.gave_back:
        if (g.job, g.epoch) in given:
            log.info("lease_given_back", job=g.job, epoch=g.epoch, reason=g.reason)
    return Verdicts(stale=stale, requeued=len(finished) + len(given))


async def _outputs_within_bounds(
    conn: Conn,
    results: list[tuple[WorkerRecord, protocol.Finished]],
    in_force: Config,
) -> list[tuple[WorkerRecord, protocol.Finished]]:
    """The results, each past its tenant's max_stored_gb replaced by one without outputs.

    The replacement says why (and failed, had it succeeded): nothing of its outputs is kept.
    """
    with_outputs = [(w, f) for w, f in results if f.outputs]
    if not with_outputs or not bounds.stores_bounded(in_force):
        return results
    tenants = await reports_q.live_jobs(conn, [(f.job, f.epoch, w.id) for w, f in with_outputs])
    refused = await room.over_stored(
        conn,
        [
            room.Bringing((f.job, f.epoch), tenant, tuple((a.sha256, a.size) for a in f.outputs))
            for _, f in with_outputs
            if (tenant := tenants.get((f.job, f.epoch))) is not None
        ],
        in_force,
    )
    if not refused:
        return results
    out = []
    for w, f in results:
        why = refused.get((f.job, f.epoch))
        if why is None:
            out.append((w, f))
            continue
        log.warning("outputs_refused_over_bound", job=f.job, epoch=f.epoch, reason=why)
        without = msgspec.structs.replace(
            f,
            outputs=(),
            state="failed" if f.state == "succeeded" else f.state,
            error=(f.error + "; " if f.error else "") + f"its outputs were not kept: {why}",
        )
        out.append((w, without))
    return out


async def _keep_metrics_and_saved(conn: Conn, batch: Reports, in_force: Config | None) -> None:
    """Metrics merge into their job, saved artifacts are referenced for its tenant.

    Both only under the reporting worker's live lease; a save past its tenant's max_stored_gb
    is not kept (a save through this server was refused before it was stored).
    """
    items = [(m.job, m.epoch, w.id) for w, m in batch.metrics]
    items += [(s.job, s.epoch, w.id) for w, s in batch.saved]
    live = await reports_q.live_jobs(conn, items)
    merged: dict[int, dict[str, float]] = {}  # in report order: the newest value wins
    for _, m in batch.metrics:
        if (m.job, m.epoch) in live:
            merged.setdefault(m.job, {}).update(m.values)
    await reports_q.merge_metrics(conn, [(job, json.dumps(v)) for job, v in merged.items()])
    saved = []
    for w, s in batch.saved:
        if (tenant := live.get((s.job, s.epoch))) is None:
            log.warning("saved_refused_stale_epoch", worker=w.name, job=s.job, epoch=s.epoch)
            continue
        saved.append(
            references.Reported(tuple(w.tenants), tenant, s.sha256, s.size, "upload", s.job)
        )
    if in_force is not None and saved and bounds.stores_bounded(in_force):
        refused = await room.over_stored(
            conn,
            [room.Bringing(i, r.tenant, ((r.sha256, r.size),)) for i, r in enumerate(saved)],
            in_force,
        )
        for i, r in enumerate(saved):
            if i in refused:
                log.warning("saved_refused_over_bound", job=r.job_id, reason=refused[i])
        saved = [r for i, r in enumerate(saved) if i not in refused]
    await references.reference_reported(conn, saved)


async def _keep_outputs(
    conn: Conn,
    accepted: list[tuple[WorkerRecord, protocol.Finished]],
    tenants: Mapping[tuple[int, int], str],
) -> None:
    """A result accepted: its outputs are referenced for the job's tenant and recorded.

    An output the server cannot vouch for (see `references.reference_reported`) is left out. A
    job's outputs are what its result lists: outputs written for it that the result does not
    list (its worker could not keep them all, or a bound refused them) are let go.
    """
    await references.drop_unlisted_outputs(
        conn, [(f.job, [a.sha256 for a in f.outputs]) for _, f in accepted]
    )
    with_outputs = [(w, f) for w, f in accepted if f.outputs]
    if not with_outputs:
        return
    vouched = await references.reference_reported(
        conn,
        [
            references.Reported(
                tuple(w.tenants), tenants[(f.job, f.epoch)], a.sha256, a.size, "output", f.job
            )
            for w, f in with_outputs
            for a in f.outputs
        ],
    )
    await reports_q.set_outputs(
        conn,
        [
            (
                f.job,
                json.dumps(
                    [
                        {"path": a.path, "sha256": a.sha256, "size": a.size}
                        for a in f.outputs
                        if (f.job, a.sha256) in vouched
                    ]
                ),
            )
            for _, f in with_outputs
        ],
    )
