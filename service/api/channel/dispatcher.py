"""This server's dispatcher: passes that lease queued jobs to the workers attached here.

Poked by NOTIFY (a job was queued anywhere), by a freed slot or a new worker here; otherwise a
fallback pass runs every `dispatch_fallback_seconds` (host samples move thresholds without any
event). One frame per worker per pass, however many leases it got.
"""

import asyncio
import contextlib
from collections.abc import Callable
from datetime import UTC, datetime

import structlog

from service import protocol
from service.api.channel.session import Sessions
from service.core.errors import BerthError, Unavailable
from service.core.placement import PoolSpec, Quotas
from service.db.engine import Database
from service.db.records import JobRecord
from service.domain import dispatch, leasing, secrets
from service.metrics import Metrics

log = structlog.get_logger(__name__)


FRAME_BUDGET = 4 << 20  # bytes of leases per frame: far below any worker's message size limit


def _weight(lease: protocol.Lease) -> int:
    """About what a lease weighs on the wire (its strings dominate)."""
    pairs = [*lease.env.items(), *lease.secrets.items()]
    return (
        256
        + len(lease.python)
        + sum(map(len, lease.command))
        + sum(len(k) + len(v) for k, v in pairs)
    )


def frames(leases: list[protocol.Lease]) -> list[protocol.Frame]:
    """One frame per pass for a worker, unless its leases are large: then several, in budget."""
    out: list[protocol.Frame] = []
    batch: list[protocol.Lease] = []
    size = 0
    for lease in leases:
        weight = _weight(lease)
        if batch and size + weight > FRAME_BUDGET:
            out.append(batch[0] if len(batch) == 1 else protocol.Leases(leases=tuple(batch)))
            batch, size = [], 0
        batch.append(lease)
        size += weight
    if batch:
        out.append(batch[0] if len(batch) == 1 else protocol.Leases(leases=tuple(batch)))
    return out


class Dispatcher:
    def __init__(
        self,
        db: Database,
        sessions: Sessions,
        *,
        pools: Callable[[], dict[str, PoolSpec]],
        quotas: Callable[[], Quotas],
        secret_key: bytes,
        fallback_seconds: float,
        metrics: Metrics,
    ) -> None:
        self.db = db
        self.sessions = sessions
        self.pools = pools  # the pools in force now (they change with the operator limits)
        self.quotas = quotas  # the tenants' quotas in force now, enforced in the claim
        self.metrics = metrics
        self.secret_key = secret_key
        self.fallback_seconds = fallback_seconds
        self._poke = asyncio.Event()

    def poke(self) -> None:
        self._poke.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), timeout=self.fallback_seconds)
            self._poke.clear()
            if stop.is_set():
                return
            try:
                done = await dispatch.run_pass(
                    self.db, self.sessions.ids(), self.pools(), self.quotas()
                )
            except Unavailable as exc:  # the database is restarting: try again shortly
                log.warning("dispatch_pass_failed", error=exc.message)
                await asyncio.sleep(0.5)
                self.poke()
                continue
            by_worker: dict[str, list[JobRecord]] = {}
            for worker_id, job in done.grants:
                by_worker.setdefault(worker_id, []).append(job)
            for worker_id, jobs in by_worker.items():
                await self._send_leases(worker_id, jobs)
            if done.grants:
                self.poke()  # slots may remain and more jobs wait: go again at once
            elif done.contended:  # another server held our picks: let it commit, then retry
                await asyncio.sleep(0.01)
                self.poke()

    async def _send_leases(self, worker_id: str, jobs: list[JobRecord]) -> None:
        leases = []
        now = datetime.now(UTC)
        for job in jobs:
            if (lease := await self._lease(job)) is not None:
                leases.append(lease)
                self.metrics.started(job.pool, job.kind, (now - job.created_at).total_seconds())
        session = self.sessions.get(worker_id)
        if not leases:
            return
        # A lease that does not reach its worker (the socket just closed) is freed when the
        # worker attaches again without it, or by the silence window.
        sent = session is not None and all(session.send(f) for f in frames(leases))
        for lease in leases:
            log.debug(
                "lease_granted", job=lease.job, epoch=lease.epoch, worker_id=worker_id, sent=sent
            )

    async def _lease(self, job: JobRecord) -> protocol.Lease | None:
        values: dict[str, str] = {}
        if job.secrets:
            try:
                values = await secrets.for_lease(
                    self.db, self.secret_key, tenant=job.tenant, wanted=job.secrets
                )
            except Unavailable as exc:  # not sent: the worker's next attach or the silence frees it
                log.warning("lease_not_sent", job=job.id, error=exc.message)
                return None
            except BerthError as exc:  # a secret removed since submit, or another server's key
                log.warning("lease_refused_secret", job=job.id, reason=exc.message)
                with contextlib.suppress(Unavailable):  # if not now, the silence window frees it
                    await leasing.fail_lease(self.db, job, f"cannot start: {exc.message}")
                return None
        return protocol.Lease(
            job=job.id,
            epoch=job.attempt,
            kind=job.kind,
            tenant=job.tenant,
            command=tuple(job.command),
            python=job.python,
            python_sha256=job.python_sha256,
            inputs=tuple(
                protocol.Input(name=i["name"], sha256=i["sha256"], kind=i.get("kind", "file"))  # type: ignore[arg-type]
                for i in job.inputs
            ),
            repo=job.repo,
            env=dict(job.env),
            secrets=values,
            timeout_seconds=job.timeout_seconds,
            cpus=job.cpus,
            memory_mb=job.memory_mb,
            gpus=job.gpus,
        )
