"""The workers attached to this server.

Their sockets, the dispatcher, heartbeat batching, and what NOTIFY tells this server about
them (cancel, drain, revoke).

One dispatcher task per server runs passes back to back whenever poked (a job was queued
anywhere, a slot freed here, a worker attached), so a job reaches an idle worker in one pass.
Heartbeats are folded into one UPDATE per flush and acked after it commits: an ack means the
database has seen the worker, which is what the worker's self-fencing relies on.
"""

import asyncio
import contextlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from litestar.connection import WebSocket

from service import protocol
from service.api.runtime import Runtime
from service.core.errors import BerthError
from service.core.states import WorkerState
from service.db.records import JobRecord, WorkerRecord
from service.domain import dispatch, leasing, secrets

log = structlog.get_logger(__name__)


@dataclass(eq=False)
class Session:
    worker: WorkerRecord
    socket: WebSocket[Any, Any, Any]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False
    left: bool = False  # it said bye: it stopped on purpose

    async def send(self, frame: protocol.Frame) -> bool:
        """Send a frame; False when the socket is gone (the worker reconciles on reconnect)."""
        if self.closed:
            return False
        try:
            async with self.lock:
                await self.socket.send_text(protocol.encode(frame).decode())
        except Exception:  # a dead socket in any of its forms: the reader loop cleans up
            self.closed = True
            return False
        return True

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            await self.socket.close(code=code, reason=reason[:120])


class Hub:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.sessions: dict[str, Session] = {}  # worker id -> session
        self._poke = asyncio.Event()
        self._beats: dict[str, tuple[Session, int, protocol.Host]] = {}
        self._beat_ready = asyncio.Event()
        self._reports = leasing.Reports()
        self._report_sessions: dict[str, Session] = {}
        self._report_ready = asyncio.Event()
        self._tasks: set[asyncio.Future[None]] = set()

    # -- sessions --------------------------------------------------------------------------
    def add(self, session: Session) -> None:
        old = self.sessions.get(session.worker.id)
        self.sessions[session.worker.id] = session
        if old is not None and old is not session:  # the same worker dialled again
            old.closed = True
        self.poke()

    def remove(self, session: Session) -> bool:
        """Forget a session; False when a newer one of the same worker replaced it."""
        if self.sessions.get(session.worker.id) is session:
            del self.sessions[session.worker.id]
            return True
        return False

    def by_name(self, name: str) -> Session | None:
        return next((s for s in self.sessions.values() if s.worker.name == name), None)

    def poke(self) -> None:
        self._poke.set()

    # -- background tasks --------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Dispatcher and heartbeat flusher until `stop`."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._dispatcher(stop), name="dispatcher")
            tg.create_task(self._flusher(stop), name="heartbeats")
            tg.create_task(self._reporter(stop), name="reports")

    async def _dispatcher(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._poke.wait(), timeout=self.rt.config.executor.dispatch_fallback_seconds
                )
            self._poke.clear()
            if stop.is_set():
                return
            try:
                done = await dispatch.run_pass(self.rt.db, list(self.sessions), self.rt.pools)
            except Exception as exc:  # the database may be restarting: try again shortly
                log.warning("dispatch_pass_failed", error=repr(exc))
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
        """One frame per worker per pass, however many leases it got."""
        leases = [lease for job in jobs if (lease := await self._lease(job)) is not None]
        session = self.sessions.get(worker_id)
        frame: protocol.Frame = (
            leases[0] if len(leases) == 1 else protocol.Leases(leases=tuple(leases))
        )
        sent = bool(leases) and session is not None and await session.send(frame)
        for lease in leases:
            log.debug(
                "lease_granted", job=lease.job, epoch=lease.epoch, worker_id=worker_id, sent=sent
            )

    async def _lease(self, job: JobRecord) -> protocol.Lease | None:
        values: dict[str, str] = {}
        if job.secrets:
            try:
                values = await secrets.for_lease(
                    self.rt.db, self.rt.secret_key, tenant=job.tenant, wanted=job.secrets
                )
            except BerthError as exc:  # a secret removed since submit, or another server's key
                log.warning("lease_refused_secret", job=job.id, reason=exc.message)
                await leasing.fail_lease(self.rt.db, job, f"cannot start: {exc.message}")
                return None
        return protocol.Lease(
            job=job.id,
            epoch=job.attempt,
            kind=job.kind,
            command=tuple(job.command),
            python=job.python,
            env=dict(job.env),
            secrets=values,
            timeout_seconds=job.timeout_seconds,
        )

    def beat(self, session: Session, frame: protocol.Beat) -> None:
        self._beats[session.worker.id] = (session, frame.seq, frame.host)
        self._beat_ready.set()

    async def _flusher(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._beat_ready.wait(), timeout=1.0)
            self._beat_ready.clear()
            if not self._beats:
                continue
            batch, self._beats = self._beats, {}
            try:
                written = await leasing.beats(
                    self.rt.db,
                    server_id=self.rt.server_id,
                    beats=[(wid, host) for wid, (_, _, host) in batch.items()],
                )
            except Exception as exc:  # no ack: the worker's watchdog counts the silence
                log.warning("heartbeats_not_written", error=repr(exc), count=len(batch))
                await asyncio.sleep(0.2)
                continue
            for wid, (session, seq, _) in batch.items():
                if wid in written:
                    await session.send(protocol.Ack(seq=seq))
                else:  # the worker re-attached to another server: this socket is stale
                    await session.close(4000, "attached elsewhere")
            # No poke: a host sample crossing a threshold is picked up by the fallback pass.

    def report(
        self, session: Session, frame: protocol.Started | protocol.Output | protocol.Finished
    ) -> None:
        batch = self._reports
        match frame:
            case protocol.Started():
                batch.started.append((session.worker, frame))
            case protocol.Output():
                batch.output.append((session.worker, frame))
            case protocol.Finished():
                batch.finished.append((session.worker, frame))
        self._report_sessions[session.worker.id] = session
        self._report_ready.set()

    async def _reporter(self, stop: asyncio.Event) -> None:
        """Apply everything reported since the last flush in one transaction, then answer."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._report_ready.wait(), timeout=1.0)
            self._report_ready.clear()
            if not len(self._reports):
                continue
            batch, self._reports = self._reports, leasing.Reports()
            sessions, self._report_sessions = self._report_sessions, {}
            try:
                verdicts = await leasing.report(self.rt.db, batch)
            except Exception as exc:  # Postgres away: results come again (the worker resends)
                log.warning("reports_not_written", error=repr(exc), count=len(batch))
                await asyncio.sleep(0.2)
                continue
            for worker_id, job, epoch in verdicts.acked:
                if s := sessions.get(worker_id):
                    await s.send(protocol.ResultAck(job=job, epoch=epoch))
            for worker_id, job, epoch in verdicts.stale:
                if s := sessions.get(worker_id):
                    await s.send(protocol.Stale(job=job, epoch=epoch))
            if batch.finished:
                self.poke()  # slots were freed
                for worker_id in {w.id for w, _ in batch.finished}:
                    if s := sessions.get(worker_id):
                        await self.exit_if_drained(s)

    def bye(self, session: Session, frame: protocol.Bye) -> None:
        """A stopping worker gave its leases back: free them now (its copies are dead)."""
        session.left = True
        task = asyncio.ensure_future(self._release(session, frame.released))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(self, session: Session, released: tuple[tuple[int, int], ...]) -> None:
        try:
            freed = await leasing.release(self.rt.db, session.worker, released)
        except BerthError as exc:  # the silence window frees them instead
            log.warning("release_failed", worker=session.worker.name, error=exc.message)
            return
        log.info("worker_left", worker=session.worker.name, released=freed)
        self.poke()

    # -- what other servers tell us --------------------------------------------------------
    async def on_worker_notice(self, payload: str) -> None:
        try:
            notice = json.loads(payload)
            session = self.by_name(str(notice["worker"]))
        except (ValueError, KeyError, TypeError):
            log.warning("bad_worker_notice", payload=payload[:200])
            return
        op = notice.get("op")
        if op == "revoke":
            self.rt.forget_caller(str(notice["worker"]))
        if session is None:
            return
        if op == "cancel":
            await session.send(protocol.Cancel(job=int(notice["job"]), epoch=int(notice["epoch"])))
            self.poke()
        elif op == "revoke":
            log.warning("worker_token_revoked", worker=session.worker.name)
            await session.send(protocol.Exit(reason="its token was revoked", code=3))
            await session.close(4003, "token revoked")
        elif op == "state":
            state = WorkerState(notice["state"])
            session.worker = _with_state(session.worker, state)
            await self.exit_if_drained(session)
            self.poke()

    async def exit_if_drained(self, session: Session) -> None:
        """A draining worker that holds nothing is told to exit (0: it did what was asked)."""
        if session.worker.state != WorkerState.DRAINING:
            return
        try:
            empty = await leasing.holds_nothing(self.rt.db, session.worker.id)
        except BerthError:
            return
        if empty:
            await session.send(protocol.Exit(reason="drained", code=0))


def _with_state(worker: WorkerRecord, state: WorkerState) -> WorkerRecord:
    return replace(worker, state=str(state))
