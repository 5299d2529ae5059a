"""Rotating a joined worker's credential over its socket (SPEC section 2, two phases).

Every `[executor] credential_rotate_hours`: the next credential is made valid and sent; the
worker stores it and says so; then it replaces the old one, which is refused from then on. A
worker that never confirms keeps both valid until the next try: it is never locked out by a
rotation it did not finish.
"""

import asyncio
import contextlib
from collections.abc import Callable

import structlog

from service import protocol
from service.api.channel.session import Session
from service.core.errors import BerthError
from service.db.engine import Database
from service.domain import joining

log = structlog.get_logger(__name__)

CONFIRM_WAIT = 30.0  # seconds a worker has to store a new credential before the next try


class Credentials:
    def __init__(
        self, db: Database, *, rotate_hours: float, forget_caller: Callable[[str], None]
    ) -> None:
        self.db = db
        self.rotate_hours = rotate_hours
        self.forget_caller = forget_caller
        self._stored: dict[int, asyncio.Event] = {}  # id(session) -> its confirmation

    async def rotate_when_due(self, session: Session) -> None:
        """For this session's life: rotate its credential whenever it is due."""
        hours = self.rotate_hours
        name = session.worker.name
        while not session.closed:
            try:
                due = await joining.rotation_due(self.db, name, hours=hours)
            except BerthError:
                due = 60.0  # the database is away: look again later
            if due is None:
                return  # not a joined credential: its operator rotates it
            if due > 0:
                await asyncio.sleep(min(due, 3600.0))
                continue
            await self._rotate(session, name)

    async def _rotate(self, session: Session, name: str) -> None:
        confirmed = self._stored[id(session)] = asyncio.Event()
        try:
            credential = await joining.begin_rotation(self.db, name)
            if credential is None or not session.send(protocol.Credential(token=credential)):
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(confirmed.wait(), timeout=CONFIRM_WAIT)
            if confirmed.is_set() and await joining.finish_rotation(self.db, name):
                self.forget_caller(name)
                log.info("worker_credential_rotated", worker=name)
            else:
                log.warning("worker_credential_not_confirmed", worker=name)
                await asyncio.sleep(CONFIRM_WAIT)
        except BerthError as exc:
            log.warning("worker_credential_rotation_failed", worker=name, error=exc.message)
            await asyncio.sleep(CONFIRM_WAIT)
        finally:
            self._stored.pop(id(session), None)

    def stored(self, session: Session) -> None:
        """The worker says it stored the credential last sent."""
        if (event := self._stored.get(id(session))) is not None:
            event.set()
