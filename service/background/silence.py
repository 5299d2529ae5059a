"""The two stages of silence (SPEC §5): unreachable -> no new lease; lost -> leases expire.

Then, much later, a lost or gone worker holding no lease is forgotten: it leaves `worker list`
after `[executor] forget_lost_after_seconds`.
"""

from service.background.loop import Loop
from service.config import Executor
from service.db.engine import Database
from service.domain import fleet, leasing


class ExpireSilent(Loop):
    name = "expire_silent"

    def __init__(self, db: Database, executor: Executor) -> None:
        super().__init__(interval=min(executor.loop_seconds, executor.heartbeat_seconds))
        self._db = db
        self._executor = executor

    async def run_once(self) -> None:
        await leasing.expire_silent(
            self._db,
            unreachable=self._executor.unreachable_seconds,
            evict=self._executor.evict_seconds,
        )
        await fleet.forget_lost(self._db, after=self._executor.forget_lost_after_seconds)
