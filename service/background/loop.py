"""Base for leader-only periodic work. Subclasses write `run_once`; this class owns cadence."""

import abc
import asyncio
import contextlib
import time
from typing import ClassVar

import structlog

log = structlog.get_logger(__name__)


class Loop(abc.ABC):
    name: ClassVar[str]

    def __init__(self, *, interval: float) -> None:
        self.interval = interval

    @abc.abstractmethod
    async def run_once(self) -> None:
        """One pass. Must be idempotent: a pass may be cut short and re-run by another leader."""

    async def run(self, stop: asyncio.Event, *, passes: int | None = None) -> None:
        """Run passes every `interval` seconds until `stop` (or `passes` are done, in tests)."""
        done = 0
        while not stop.is_set() and (passes is None or done < passes):
            started = time.monotonic()
            try:
                await self.run_once()
            except Exception as exc:  # one failed pass (e.g. Postgres restarting) must not end it
                log.warning("loop_pass_failed", loop=self.name, error=repr(exc))
            elapsed = time.monotonic() - started
            if elapsed > self.interval:
                log.warning("loop_pass_overran", loop=self.name, elapsed=round(elapsed, 3))
            done += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, self.interval - elapsed))
