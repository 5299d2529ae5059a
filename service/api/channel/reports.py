"""Reports from the workers attached here: batched, applied, then answered.

`received(upto)` goes to each worker only after its reports committed (or were refused as
stale), so a worker drops a report only once it is safe in Postgres. A batch the database
cannot take right now is kept, with newer reports appended, and tried again: nothing is
dropped, and the workers keep their copies until they hear `received`.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable

import structlog

from service import protocol
from service.api.channel.session import Session
from service.config import Config
from service.core.errors import Unavailable
from service.db.engine import Database
from service.domain import reports
from service.metrics import Metrics

log = structlog.get_logger(__name__)


class ReportBatcher:
    def __init__(
        self,
        db: Database,
        *,
        in_force: Callable[[], Config],
        on_freed: Callable[[list[Session]], Awaitable[None]],
        metrics: Metrics,
    ) -> None:
        self.db = db
        self.metrics = metrics
        self.in_force = in_force  # berth.toml with the operator limits in force now
        self._on_freed = on_freed
        self._batch = reports.Reports()
        self._upto: dict[str, tuple[Session, int]] = {}  # worker id -> (session, highest seq)
        self._ready = asyncio.Event()

    def add(self, session: Session, report: protocol.Report) -> None:
        self._batch.add(session.worker, report)
        _, upto = self._upto.get(session.worker.id, (session, 0))
        self._upto[session.worker.id] = (session, max(upto, report.seq))
        self._ready.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout=1.0)
            self._ready.clear()
            if not len(self._batch):
                continue
            batch, self._batch = self._batch, reports.Reports()
            upto, self._upto = self._upto, {}
            try:
                verdicts = await reports.apply(self.db, batch, in_force=self.in_force())
            except Unavailable as exc:  # keep it all, newer reports after it, and try again
                log.warning("reports_not_written", error=exc.message, count=len(batch))
                batch.extend(self._batch)
                self._batch = batch
                for wid, (session, seq) in self._upto.items():
                    upto[wid] = (session, max(seq, upto.get(wid, (session, 0))[1]))
                self._upto = upto
                await asyncio.sleep(0.2)
                self._ready.set()
                continue
            self._count(batch, verdicts.stale)
            by_id = {wid: session for wid, (session, _) in upto.items()}
            for worker_id, job, epoch in verdicts.stale:
                if s := by_id.get(worker_id):
                    s.send(protocol.Stale(job=job, epoch=epoch))
            for session, seq in upto.values():
                session.send(protocol.Received(upto=seq))
            if verdicts.requeued:
                finished = {w.id for w, _ in batch.finished} | {w.id for w, _ in batch.gave_back}
                await self._on_freed([by_id[w] for w in finished if w in by_id])

    def _count(self, batch: reports.Reports, stale: Iterable[tuple[str, int, int]]) -> None:
        """Jobs that started or finished, for /metrics; a stale report changed nothing."""
        refused = {(job, epoch) for _, job, epoch in stale}
        for _, started in batch.started:
            if (started.job, started.epoch) not in refused:
                self.metrics.transitions.labels("running").inc()
        for _, done in batch.finished:
            if (done.job, done.epoch) not in refused:
                self.metrics.transitions.labels(done.state).inc()
