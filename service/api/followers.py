"""Who follows which job on this server, woken by NOTIFY berth_job_events_v1.

One LISTEN connection per server (service/db/notify.py) feeds every follower here from memory:
a follower costs the database a read when its job changed, and nothing while the job is silent.
A wake-up is an Event, so notices that arrive faster than a follower reads fold into one read.
"""

import asyncio
import contextlib
from collections.abc import Iterator

import structlog

log = structlog.get_logger(__name__)

JOB_EVENTS_CHANNEL = "berth_job_events_v1"  # payload: the job's id (migration 0010's triggers)


class Followers:
    def __init__(self) -> None:
        self._by_job: dict[int, set[asyncio.Event]] = {}
        self.closed = False  # the server stops: streams end (without `end`; clients dial again)

    def __len__(self) -> int:
        return sum(len(s) for s in self._by_job.values())

    @contextlib.contextmanager
    def follow(self, job_id: int) -> Iterator[asyncio.Event]:
        """An Event set when `job_id` changes; taken before the first read, so none is missed."""
        changed = asyncio.Event()
        self._by_job.setdefault(job_id, set()).add(changed)
        try:
            yield changed
        finally:
            followers = self._by_job.get(job_id)
            if followers is not None:
                followers.discard(changed)
                if not followers:
                    del self._by_job[job_id]

    def on_notice(self, payload: str) -> None:
        """NOTIFY handler: wake the followers of the job named by `payload`."""
        try:
            job_id = int(payload)
        except ValueError:
            log.warning("job_event_payload_bad", payload=payload[:100])
            return
        for changed in self._by_job.get(job_id, ()):
            changed.set()

    def wake_all(self) -> None:
        """After LISTEN reconnects: notices sent while it was down are lost, so everyone reads."""
        for followers in self._by_job.values():
            for changed in followers:
                changed.set()

    def close(self) -> None:
        """The server stops: every stream ends at its next wake-up, which is now."""
        self.closed = True
        self.wake_all()
