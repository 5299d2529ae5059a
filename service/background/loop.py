"""Base for leader-only periodic work: subclasses write `run_once`, this class owns the rest.

That is the cadence and the error policy (docs/architecture.md, Errors).

A pass that fails with an expected error (`core.errors.EXPECTED`: the database restarting, a
provider refusing) is logged as a warning and the loop goes on. Any other error is a bug: it is
logged with its traceback, and after `max_failures` such passes in a row the loop raises
`LoopFailed`, which stops the server (procrastinate's rule: a dead side task stops the worker)
instead of repeating a deterministic failure forever.
"""

import abc
import asyncio
import contextlib
import time
from typing import ClassVar

import structlog

from service.core.errors import EXPECTED

log = structlog.get_logger(__name__)

MAX_FAILURES = 3  # [executor] loop_max_failures


class LoopFailed(Exception):
    """A loop's passes failed with an unexpected error `max_failures` times in a row."""


class Loop(abc.ABC):
    name: ClassVar[str]

    def __init__(self, *, interval: float) -> None:
        self.interval = interval

    @abc.abstractmethod
    async def run_once(self) -> None:
        """One pass. Must be idempotent: a pass may be cut short and re-run by another leader."""

    async def run(
        self, stop: asyncio.Event, *, passes: int | None = None, max_failures: int = MAX_FAILURES
    ) -> None:
        """Run passes every `interval` seconds until `stop` (or `passes` are done, in tests).

        Raises LoopFailed after `max_failures` passes in a row end in an unexpected error.
        """
        done = failures = 0
        while not stop.is_set() and (passes is None or done < passes):
            started = time.monotonic()
            try:
                await self.run_once()
            except EXPECTED as exc:  # weather, not a bug: the next pass tries again
                log.warning("loop_pass_failed", loop=self.name, error=str(exc))
            except Exception as exc:
                failures += 1
                log.exception(  # with the traceback
                    "loop_pass_crashed", loop=self.name, failures=failures, of=max_failures
                )
                if failures >= max_failures:
                    raise LoopFailed(
                        f"the {self.name} loop failed {failures} passes in a row: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
            else:
                failures = 0
            elapsed = time.monotonic() - started
            if elapsed > self.interval:
                log.warning("loop_pass_overran", loop=self.name, elapsed=round(elapsed, 3))
            done += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=max(0.0, self.interval - elapsed))
