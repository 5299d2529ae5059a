"""Tenants' queued jobs as last counted here: a submit far below its bound skips the count.

Why: the count walks every queued job of the tenant (ix_jobs_queued, with a heap fetch per
fresh row): 3 ms at 6,000 queued, growing with the queue, on every submit. Exactness matters
only near the bound. A tenant counted less than `fresh_seconds` ago at less than half its
bound, with this server's own submits since added, is not counted again: to pass the bound
unseen, other servers would have to queue half of it for that tenant within `fresh_seconds`.
Dispatch only lowers the real figure, so the remembered one errs on the side of counting.
"""

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

FRESH_SECONDS = 1.0
KEPT = 10_000  # tenants remembered at most; the stalest go first


@dataclass
class QueuedSeen:
    """Each tenant's queued jobs as last counted here, plus this server's submits since."""

    fresh_seconds: float = FRESH_SECONDS
    _seen: dict[str, tuple[float, int]] = field(default_factory=dict)

    def uncounted(self, adding: dict[str, int], bounds: dict[str, int]) -> frozenset[str]:
        """The tenants of a submit that need no count: recently counted, far below the bound."""
        now = time.monotonic()
        skip = set()
        for tenant, n in adding.items():
            seen = self._seen.get(tenant)
            if seen and now - seen[0] <= self.fresh_seconds and 2 * (seen[1] + n) <= bounds[tenant]:
                skip.add(tenant)
        return frozenset(skip)

    def submitted(self, adding: dict[str, int], counted: Iterable[tuple[str, int]]) -> None:
        """After a submit committed: the counts it made (before its jobs), and its jobs."""
        now = time.monotonic()
        fresh = dict(counted)
        for tenant, n in adding.items():
            if tenant in fresh:
                self._seen[tenant] = (now, fresh[tenant] + n)
            elif tenant in self._seen:
                at, queued = self._seen[tenant]
                self._seen[tenant] = (at, queued + n)
        if len(self._seen) > KEPT:
            for tenant, _ in sorted(self._seen.items(), key=lambda kv: kv[1][0])[: KEPT // 2]:
                del self._seen[tenant]
