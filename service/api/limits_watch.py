"""This server's limits in force: `rt.limits` and `rt.pools`, re-read from the limits table.

Read at start (before the first dispatch pass), after this server writes a limit, on every
NOTIFY berth_limits_v1 and after the LISTEN connection comes back (notifications sent while it
was down are lost), and every FALLBACK_SECONDS as a safety net: one query on a small table.
When the pools in force change, the dispatcher is poked: a raised slot count may place
waiting jobs now.
"""

import asyncio

import structlog

from service.api.runtime import Runtime
from service.core.errors import Unavailable
from service.domain import limits

log = structlog.get_logger(__name__)

FALLBACK_SECONDS = 5.0


async def refresh(rt: Runtime) -> bool:
    """Re-read the limits; update rt.limits, rt.pools and rt.quotas. True when those changed."""
    async with rt.limits_lock:  # reads in order: the last one started is the one kept
        found = await limits.in_force(rt.db, rt.config)
        if found.records == rt.limits.records:
            return False
        pools = found.pools()
        quotas = found.config.quotas()
        # A raised slot count or quota may place waiting jobs now.
        changed = pools != rt.pools or quotas != rt.quotas
        rt.limits, rt.pools, rt.quotas = found, pools, quotas
    shown = found.shown()
    log.info(
        "limits_read",
        limits={x["key"]: x["value"] for x in shown if x["in_force"]},
        pools_changed=changed,
    )
    for x in shown:
        if not x["in_force"]:
            log.warning("limit_not_in_force", key=x["key"], reason=x["not_in_force_because"])
    if changed and rt.hub is not None:
        rt.hub.poke()
    return changed


class Watch:
    """The side task that keeps the limits fresh; `poke()` asks for a read now."""

    def __init__(self, rt: Runtime, *, every: float = FALLBACK_SECONDS) -> None:
        self.rt = rt
        self.every = every
        self._poke = asyncio.Event()

    def poke(self) -> None:
        self._poke.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await _first(self._poke, stop, timeout=self.every)
            self._poke.clear()
            if stop.is_set():
                return
            try:
                await refresh(self.rt)
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
