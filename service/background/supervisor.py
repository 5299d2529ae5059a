"""Lead when possible: run the loops under the advisory lock; on losing it, queue again."""

import asyncio
from collections.abc import Sequence

import structlog

from service.background.loop import Loop
from service.db.leader import Leader, LeadershipLost

log = structlog.get_logger(__name__)


async def run_when_leader(leader: Leader, loops: Sequence[Loop], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            async with leader.held(stop):
                if stop.is_set():
                    return
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(leader.watch(stop), name="leader-watch")
                    for loop in loops:
                        tg.create_task(loop.run(stop), name=loop.name)
        except* LeadershipLost:
            log.warning("leader_lost")
        except* (OSError, TimeoutError, ConnectionError) as group:
            log.warning("leader_db_unavailable", error=repr(group.exceptions[0]))
            await asyncio.sleep(1.0)
        except* Exception as group:  # asyncpg errors and the like: step down, then try again
            log.warning("leader_stepped_down", error=repr(group.exceptions[0]))
            await asyncio.sleep(1.0)
