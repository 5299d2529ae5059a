"""Collect artifacts nothing holds any more: the leader runs `artifact_gc.collect` each pass.

The store is listed (for blobs that no reference names) on the first pass and then at most
every `sweep_seconds`: a listing costs a request per thousand blobs on S3.
"""

import time

import structlog

from service.background.loop import Loop
from service.db.engine import Database
from service.domain import artifact_gc
from service.domain.artifacts.server_store import ServerStore

log = structlog.get_logger(__name__)

SWEEP_SECONDS = 3600.0


class CollectArtifacts(Loop):
    name = "collect_artifacts"

    def __init__(
        self,
        db: Database,
        server: ServerStore,
        *,
        interval: float,
        sweep_seconds: float = SWEEP_SECONDS,
    ) -> None:
        super().__init__(interval=interval)
        self._db = db
        self._server = server
        self._sweep_seconds = sweep_seconds
        self._swept: float | None = None  # monotonic time of the last sweep

    async def run_once(self) -> None:
        now = time.monotonic()
        sweep = self._swept is None or now - self._swept >= self._sweep_seconds
        done = await artifact_gc.collect(self._db, self._server, sweep=sweep)
        if sweep:
            self._swept = now
        if done.deleted or done.noted or done.forgotten:
            log.info(
                "artifacts_collected",
                deleted=done.deleted,
                noted=done.noted,
                forgotten=done.forgotten,
            )
