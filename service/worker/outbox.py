"""Reports waiting for the server: kept until received, resent after a reconnect, bounded.

Every report gets the next sequence number of this worker process. The server answers
`received(upto=N)` after the reports up to N are in Postgres (or refused as stale), and only
then are they dropped here. A new session resends everything still here, in order, so a dropped
connection or a restarted server loses no report.

The outbox is bounded in bytes. Output waits for room (the job then blocks on its own writes,
which is backpressure, not loss); started, finished and gave_back are small and always go in,
so a job's end is never held up behind its output.
"""

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable

from service import protocol

log = logging.getLogger("berth.worker")

DEFAULT_LIMIT = 64 << 20
_SMALL = 256  # what a report without data weighs, for the byte count


class Outbox:
    def __init__(self, limit_bytes: int = DEFAULT_LIMIT) -> None:
        self.limit = limit_bytes
        # seq -> report, in seq order: an acknowledgement pops from the front, O(1) a report.
        self._pending: collections.OrderedDict[int, protocol.Report] = collections.OrderedDict()
        self._sizes: dict[int, int] = {}
        self._bytes = 0
        self._seq = 0
        self._unsent: collections.deque[int] = collections.deque()  # this session's to-do
        self._changed = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._waiting = False
        self._upto = 0  # the highest seq the server said it received
        self._acked = asyncio.Event()

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def unreceived_bytes(self) -> int:
        return self._bytes

    def put(self, make: Callable[[int], protocol.Report], size: int = 0) -> protocol.Report:
        """Queue a report of about `size` bytes (small: started, finished...); never waits."""
        self._seq += 1
        report = make(self._seq)
        self._add(report, max(size, _SMALL))
        return report

    async def put_output(self, job: int, epoch: int, stream: str, data: bytes) -> None:
        """Queue output, waiting while the outbox is full (the job's writes then block)."""
        while self._bytes + len(data) > self.limit and self._bytes > 0:
            if not self._waiting:
                self._waiting = True
                log.warning(
                    "outbox full (%d bytes not yet received by the server): output of job %s waits",
                    self._bytes,
                    job,
                )
            self._room.clear()
            await self._room.wait()
        if self._waiting:
            self._waiting = False
            log.info("outbox has room again: output flows")
        self._seq += 1
        report = protocol.Output(
            seq=self._seq,
            job=job,
            epoch=epoch,
            stream="stderr" if stream == "stderr" else "stdout",
            data=data,
        )
        self._add(report, _SMALL + len(data))

    def _add(self, report: protocol.Report, size: int) -> None:
        self._pending[report.seq] = report
        self._sizes[report.seq] = size
        self._bytes += size
        self._unsent.append(report.seq)
        self._changed.set()

    async def until_received(self, seq: int, timeout: float) -> bool:
        """Wait until the server received report `seq` (True), or `timeout` (False)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self._upto < seq:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            self._acked.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acked.wait(), timeout=left)
        return True

    def received(self, upto: int) -> None:
        """The server has everything up to `upto`: forget it, make room."""
        self._upto = max(self._upto, upto)
        self._acked.set()
        while self._pending and next(iter(self._pending)) <= upto:
            seq, _ = self._pending.popitem(last=False)
            self._bytes -= self._sizes.pop(seq)
        if self._bytes < self.limit:
            self._room.set()

    def forget(self, key: tuple[int, int]) -> None:
        """Drop what is queued for a copy whose lease is gone (stale or dropped)."""
        for seq, report in list(self._pending.items()):
            if (report.job, report.epoch) == key:
                del self._pending[seq]
                self._bytes -= self._sizes.pop(seq)
        if self._bytes < self.limit:
            self._room.set()

    def rewind(self) -> None:
        """A new session: everything still here is sent again, in order."""
        self._unsent = collections.deque(self._pending)
        self._changed.set()

    async def next(self) -> protocol.Report:
        """The next report this session has not sent yet."""
        while True:
            while self._unsent:
                report = self._pending.get(self._unsent.popleft())
                if report is not None:  # not received or forgotten meanwhile
                    return report
            self._changed.clear()
            await self._changed.wait()

    def finished_keys(self) -> set[tuple[int, int]]:
        """Copies whose result the server has not received: still held, as far as it knows."""
        return {
            (r.job, r.epoch) for r in self._pending.values() if isinstance(r, protocol.Finished)
        }

    async def drained(self, timeout: float) -> bool:
        """Wait until the server has received everything (or `timeout`); True when it has."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self._pending:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            self._room.clear()
            try:
                await asyncio.wait_for(self._room.wait(), timeout=min(left, 0.2))
            except TimeoutError:
                continue
        return True
