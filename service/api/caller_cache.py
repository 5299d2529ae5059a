"""token sha256 -> the caller it resolved to, for a few seconds: saves a transaction per request.

Revocation drops entries on every server at once (NOTIFY, `forget`); the TTL bounds what a lost
NOTIFY costs. Bounded: a flood of distinct tokens cannot grow it.
"""

import time

from service.auth.callers import Caller

TTL = 5.0
MAX_ENTRIES = 10_000


class CallerCache:
    def __init__(self, *, ttl: float = TTL) -> None:
        self._ttl = ttl
        self._by_digest: dict[bytes, tuple[Caller, float]] = {}

    def get(self, digest: bytes) -> Caller | None:
        """The cached caller of this token digest, unless it expired."""
        cached = self._by_digest.get(digest)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        return None

    def put(self, digest: bytes, caller: Caller) -> None:
        if len(self._by_digest) > MAX_ENTRIES:
            self._by_digest.clear()
        self._by_digest[digest] = (caller, time.monotonic() + self._ttl)

    def forget(self, name: str) -> None:
        """Drop every entry of the caller called `name` (its credential was revoked/rotated)."""
        for digest, (caller, _) in list(self._by_digest.items()):
            if caller.name == name:
                del self._by_digest[digest]
