"""Move jobs' older output from Postgres to the artifact store (domain/output.py)."""

from service.background.loop import Loop
from service.cas.base import Store
from service.db.engine import Database
from service.domain import output


class PackOutput(Loop):
    name = "pack_output"

    def __init__(self, db: Database, store: Store, *, tail_kb: float, interval: float) -> None:
        super().__init__(interval=interval)
        self._db = db
        self._store = store
        self._tail = int(tail_kb * 1024)

    async def run_once(self) -> None:
        while await output.pack(self._db, self._store, tail=self._tail):
            pass  # a long queue of output: keep going until every job is within its tail
