"""What other servers tell this one about workers (NOTIFY on berth_workers_v1).

Whoever holds a worker's socket acts: cancel a job's copy, make a worker whose token was revoked
leave, tell a drained provisioned worker that holds nothing to exit (a static one stays up).
Every server drops a revoked token from its cache of callers.
"""

import json
from collections.abc import Callable
from dataclasses import replace

import structlog

from service import protocol
from service.api.channel.session import Session, Sessions
from service.config import Executor
from service.core.errors import BerthError
from service.core.states import WorkerState
from service.db.engine import Database
from service.domain import leasing, provisioning

log = structlog.get_logger(__name__)


class Notices:
    def __init__(
        self,
        db: Database,
        sessions: Sessions,
        *,
        executor: Executor,
        poke: Callable[[], None],
        forget_caller: Callable[[str], None],
    ) -> None:
        self.db = db
        self.sessions = sessions
        self.executor = executor
        self.poke = poke
        self.forget_caller = forget_caller

    async def on_worker_notice(self, payload: str) -> None:
        try:
            notice = json.loads(payload)
            name = str(notice["worker"])
        except (ValueError, KeyError, TypeError):
            log.warning("bad_worker_notice", payload=payload[:200])
            return
        op = notice.get("op")
        if op in ("revoke", "rotated"):  # the credential it had is no good any more
            self.forget_caller(name)
        session = self.sessions.by_name(name)
        if session is None:
            return
        if op == "cancel":
            session.send(protocol.Cancel(job=int(notice["job"]), epoch=int(notice["epoch"])))
            self.poke()
        elif op == "revoke":
            self.revoke(session)
        elif op == "state":
            state = WorkerState(notice["state"])
            session.worker = replace(session.worker, state=str(state))
            await self.exit_if_drained(session)
            self.poke()

    def revoke(self, session: Session) -> None:
        """Its credential was revoked: end the session, moving its work at once.

        The worker is told to exit; it kills its jobs (as on cancel) and gives their leases
        back with `bye`, which frees them now instead of after the silence window, and no copy
        runs twice. From here on the session's reports are not taken (a revoked credential's
        word is not a result), only that bye; a worker that says nothing in time is cut off and
        its leases wait out the silence window.
        """
        log.warning("worker_token_revoked", worker=session.worker.name)
        session.revoked = True
        session.send(protocol.Exit(reason="its token was revoked", code=3))
        ex = self.executor
        session.close_later(ex.kill_grace_seconds + 2 * ex.heartbeat_seconds, 4003, "revoked")

    async def exit_if_drained(self, session: Session) -> None:
        """A drained provisioned worker is told to exit (0: it did what was asked).

        A static worker stays up, drained, until an operator enables it or stops it (SPEC
        section 5): nobody would start it again. A provisioned one ends, and its pool starts
        another when work waits.
        """
        if session.worker.state != WorkerState.DRAINING:
            return
        try:
            empty = await leasing.holds_nothing(self.db, session.worker.id)
            provisioned = empty and await provisioning.is_alive(self.db, session.worker.name)
        except BerthError:
            return
        if provisioned:
            session.left = True  # it leaves on purpose: gone, not silent
            session.send(protocol.Exit(reason="drained", code=0))
