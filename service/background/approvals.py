"""Approval requests past their deadline are denied (timed_out); those of ended leases closed.

Every read or answer of a request settles it first too, so this pass is what makes a request
nobody looks at end on time, with its audit entry, whichever server leads (SPEC: approvals).
"""

from service.background.loop import Loop
from service.db.engine import Database
from service.domain import approvals


class SettleApprovals(Loop):
    name = "settle_approvals"

    def __init__(self, db: Database, *, interval: float) -> None:
        super().__init__(interval=interval)
        self._db = db

    async def run_once(self) -> None:
        await approvals.settle(self._db)
