"""This server's limits in force, and the side task that keeps them fresh from the limits table.

`InForceHere` is what the dispatcher and the routes read: berth.toml with the operator limits,
and the pools made from it. Only `Watch` writes it. It re-reads the table at start (before the
first dispatch pass), after this server writes a limit, on every NOTIFY berth_limits_v1 and
after the LISTEN connection comes back (notifications sent while it was down are lost), and
every FALLBACK_SECONDS as a safety net: one query on a small table. When the pools in force
change, `on_change` runs (the hub's poke): a raised slot count may place waiting jobs now.
"""

import asyncio
from collections.abc import Callable

import structlog

from service.config import Config
from service.core.errors import Unavailable
from service.core.placement import PoolSpec, Quotas
from service.db.engine import Database
from service.domain import limits
from service.domain.limits import InForce

log = structlog.get_logger(__name__)

FALLBACK_SECONDS = 5.0


class InForceHere:
    """The limits as this server last read them, and the pools made from them."""

    def __init__(self, config: Config) -> None:
        self.limits = InForce.of(config)  # berth.toml alone until the first read
        self.pools: dict[str, PoolSpec] = config.pool_specs()
        self.quotas: Quotas = self.limits.config.quotas()  # the tenants' quotas, for the claim

    @property
    def effective(self) -> Config:
        """berth.toml with the operator limits in force on this server."""
        return self.limits.config


class Watch:
    """The side task that keeps `state` fresh; `poke()` asks for a read now."""

    def __init__(
        self,
        db: Database,
        config: Config,
        state: InForceHere,
        *,
        on_change: Callable[[], None],
        every: float = FALLBACK_SECONDS,
    ) -> None:
        self.db = db
        self.config = config
        self.state = state
        self.every = every
        self._on_change = on_change
        self._poke = asyncio.Event()
        self._lock = asyncio.Lock()

    def poke(self) -> None:
        self._poke.set()

    async def refresh(self) -> bool:
        """Re-read the limits; update the state. True when the pools or quotas changed."""
        async with self._lock:  # reads in order: the last one started is the one kept
            found = await limits.in_force(self.db, self.config)
            if found.records == self.state.limits.records:
                return False
            pools = found.pools()
            quotas = found.config.quotas()
            # A raised slot count or quota may place waiting jobs now.
            changed = pools != self.state.pools or quotas != self.state.quotas
            self.state.limits, self.state.pools, self.state.quotas = found, pools, quotas
        shown = found.shown()
        log.info(
            "limits_read",
            limits={x["key"]: x["value"] for x in shown if x["in_force"]},
            pools_changed=changed,
        )
        for x in shown:
            if not x["in_force"]:
                log.warning("limit_not_in_force", key=x["key"], reason=x["not_in_force_because"])
        if changed:
            self._on_change()
        return changed

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await _first(self._poke, stop, timeout=self.every)
            self._poke.clear()
            if stop.is_set():
                return
            try:
                await self.refresh()
            except Unavailable as exc:  # the database is restarting: the next read catches up
                log.warning("limits_read_failed", error=exc.message)


async def _first(a: asyncio.Event, b: asyncio.Event, *, timeout: float) -> None:
    """Wait until either event is set, or `timeout` passes."""
    waiters = [asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
