"""Seal new audit entries into the keyed hash chain, in batches, off the write path."""

from service.background.loop import Loop
from service.db.engine import Database
from service.domain import audit


class SealAudit(Loop):
    name = "seal_audit"

    def __init__(self, db: Database, key: bytes, *, interval: float) -> None:
        super().__init__(interval=interval)
        self._db = db
        self._key = key

    async def run_once(self) -> None:
        await audit.seal(self._db, self._key)
