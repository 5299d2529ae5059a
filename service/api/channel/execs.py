"""Exec sessions relayed by this server: a client's websocket on one side, a worker's on the other.

Each session is a small object with a queue, never a thread. Frames from a worker arrive on its
socket's reader loop, which must never wait (the worker's beats come the same way): they are put
in the session's queue at once. The worker sends at most EXEC_WINDOW output frames before an
ack, so an honest worker never grows it further; one that does is cut from that exec.
"""

import asyncio
import itertools
from dataclasses import dataclass, field

import structlog

from service import protocol
from service.api.channel.session import Session

log = structlog.get_logger(__name__)

FromWorker = protocol.ExecOutput | protocol.ExecExit | protocol.ExecTaken
QUEUE_BOUND = 2 * protocol.EXEC_WINDOW + 2  # output + acks in flight, and the exit
# Exec sessions doing database work (admission, audit) at once: a burst of sessions must leave
# the pool's connections to heartbeats and reports, or every worker of this server would miss
# its acks and go unreachable.
DB_AT_ONCE = 4


@dataclass(eq=False)
class Relayed:
    """One exec: its id on this server, the worker session it runs through, what came back."""

    id: int
    session: Session
    frames: asyncio.Queue[FromWorker] = field(default_factory=asyncio.Queue)
    # Input frames the worker has not acked yet: a client typing faster than the command
    # reads waits here, not in the worker's send queue.
    credit: asyncio.BoundedSemaphore = field(
        default_factory=lambda: asyncio.BoundedSemaphore(protocol.EXEC_WINDOW)
    )


class ExecRelays:
    """The exec sessions of this server, by id (unique per server process)."""

    def __init__(self) -> None:
        self._by_id: dict[int, Relayed] = {}
        self._ids = itertools.count(1)
        self.db_turns = asyncio.Semaphore(DB_AT_ONCE)

    def __len__(self) -> int:
        return len(self._by_id)

    def open(self, session: Session) -> Relayed:
        relayed = Relayed(next(self._ids), session)
        self._by_id[relayed.id] = relayed
        return relayed

    def close(self, relayed: Relayed) -> None:
        self._by_id.pop(relayed.id, None)

    def deliver(self, session: Session, frame: FromWorker) -> None:
        """A worker's frame for an exec; never waits."""
        relayed = self._by_id.get(frame.exec)
        if relayed is None or relayed.session is not session:
            return  # an exec that ended, or one this worker does not run: nothing to say
        if relayed.frames.qsize() >= QUEUE_BOUND:
            log.warning("exec_window_overrun", worker=session.worker.name, exec=relayed.id)
            self._lost(relayed, "the worker sent more than the exec window allows")
            return
        relayed.frames.put_nowait(frame)

    def worker_gone(self, session: Session) -> None:
        """The worker's connection closed: every exec through it ends, saying so."""
        for relayed in [r for r in self._by_id.values() if r.session is session]:
            self._lost(relayed, "the job's worker lost its connection to the server")

    def _lost(self, relayed: Relayed, why: str) -> None:
        self.close(relayed)
        relayed.frames.put_nowait(protocol.ExecExit(exec=relayed.id, error=why))
