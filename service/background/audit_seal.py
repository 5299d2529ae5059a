"""Seal new audit entries into the keyed hash chain, in batches, off the write path.

The head after each pass is also kept in this server's home (`audit.head`, 0600), outside the
database: `berth audit verify` run there checks the chain still holds it, with no flags, so a
database writer who deletes or rewrites the tail is caught.
"""

from pathlib import Path

from service.background.loop import Loop
from service.core import audit_chain
from service.db.embedded import write_private
from service.db.engine import Database
from service.domain import audit

HEAD_FILE = "audit.head"


class SealAudit(Loop):
    name = "seal_audit"

    def __init__(self, db: Database, key: bytes, *, home: Path, interval: float) -> None:
        super().__init__(interval=interval)
        self._db = db
        self._key = key
        self._home = home
        self._kept = kept_head(home)

    async def run_once(self) -> None:
        done = await audit.seal(self._db, self._key, may_anchor=self._kept is None)
        # Only forward: a head this server sealed. A chain that got shorter behind its back
        # must not move the kept head back (that is what `audit verify` catches).
        if done.head is not None and (self._kept is None or done.head[0] > self._kept[0]):
            tmp = write_private(self._home / f".{HEAD_FILE}.tmp", audit_chain.show_head(*done.head))
            tmp.replace(self._home / HEAD_FILE)  # whole or not at all
            self._kept = done.head


def kept_head(home: Path) -> tuple[int, bytes] | None:
    """The head kept in `home`, or None when there is none (or it is unreadable)."""
    try:
        return audit_chain.parse_head((home / HEAD_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
