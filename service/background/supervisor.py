"""Lead when possible: run the loops under the advisory lock; on losing it, queue again.

Losing the lock or the database (`Unavailable`) is expected: step down, queue for the lock
again. Anything else (a loop's `LoopFailed`, a bug here) is not retried: it ends this task, and
with it the server, loudly (docs/architecture.md, Errors).
"""

import asyncio
from collections.abc import Sequence

import structlog

from service.background.loop import MAX_FAILURES, Loop
from service.core.errors import Unavailable
from service.db.leader import Leader, LeadershipLost

log = structlog.get_logger(__name__)


async def run_when_leader(
    leader: Leader,
    loops: Sequence[Loop],
    stop: asyncio.Event,
    *,
    max_failures: int = MAX_FAILURES,
) -> None:
    while not stop.is_set():
        try:
            async with leader.held(stop):
                if stop.is_set():
                    return
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(leader.watch(stop), name="leader-watch")
                    for loop in loops:
                        tg.create_task(loop.run(stop, max_failures=max_failures), name=loop.name)
        except* LeadershipLost:
            log.warning("leader_lost")
        except* Unavailable as group:
            log.warning("leader_db_unavailable", error=str(group.exceptions[0]))
            await asyncio.sleep(1.0)
