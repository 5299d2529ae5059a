"""Heartbeats: folded into one UPDATE per flush, each acked only after it commits.

An ack tells the worker the database has seen it; the worker's self-fencing counts acks, so
an ack is never sent for a beat that was not written.
"""

import asyncio
import contextlib
import time

import structlog

from service import protocol
from service.api.channel.session import Session
from service.core.errors import Unavailable
from service.db.engine import Database
from service.domain import leasing
from service.metrics import Metrics

log = structlog.get_logger(__name__)


class Heartbeats:
    def __init__(self, db: Database, *, server_id: str, metrics: Metrics) -> None:
        self.db = db
        self.server_id = server_id
        self.metrics = metrics
        # worker id -> (session, seq, host sample, when it arrived)
        self._beats: dict[str, tuple[Session, int, protocol.Host, float]] = {}
        self._ready = asyncio.Event()

    def add(self, session: Session, frame: protocol.Beat) -> None:
        self._beats[session.worker.id] = (session, frame.seq, frame.host, time.monotonic())
        self._ready.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout=1.0)
            self._ready.clear()
            if not self._beats:
                continue
            batch, self._beats = self._beats, {}
            try:
                written = await leasing.beats(
                    self.db,
                    server_id=self.server_id,
                    beats=[(wid, host) for wid, (_, _, host, _) in batch.items()],
                )
            except Unavailable as exc:  # no ack: the worker's watchdog counts the silence
                log.warning("heartbeats_not_written", error=exc.message, count=len(batch))
                await asyncio.sleep(0.2)
                continue
            acked = time.monotonic()
            for wid, (session, seq, _, arrived) in batch.items():
                if wid in written:
                    session.send(protocol.Ack(seq=seq))
                    self.metrics.ack_latency.observe(acked - arrived)
                else:  # the worker re-attached to another server: this socket is stale
                    session.close_soon(4000, "attached elsewhere")
            # No poke: a host sample crossing a threshold is picked up by the fallback pass.
