"""LISTEN on berth's channels over one dedicated asyncpg connection, reconnecting forever.

NOTIFY payloads carry what the listener needs (a worker's name, a job and epoch), so a wake-up
needs no query. After a reconnect, `on_reconnect` runs: notifications sent while the connection
was down are lost, so the caller does a full pass instead.
"""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping

import asyncpg
import structlog

from service.db.engine import UNAVAILABLE, plain_url
from service.tasks import spawn

log = structlog.get_logger(__name__)

Handler = Callable[[str], Awaitable[None] | None]


async def listen(
    url: str,
    handlers: Mapping[str, Handler],
    stop: asyncio.Event,
    *,
    on_reconnect: Callable[[], None] = lambda: None,
    ready: asyncio.Event | None = None,
) -> None:
    """Deliver each notification's payload to its channel's handler until `stop` is set."""
    delay = 0.2
    while not stop.is_set():
        conn: asyncpg.Connection | None = None
        try:
            conn = await asyncpg.connect(plain_url(url), timeout=5)
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _c, lost=lost: lost.set())
            for channel, handler in handlers.items():
                await conn.add_listener(channel, _deliver(handler))
            log.info("listening", channels=sorted(handlers))
            delay = 0.2
            on_reconnect()
            if ready is not None:
                ready.set()
            while not stop.is_set() and not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=2.0)
                if not stop.is_set() and not lost.is_set():
                    await conn.execute("SELECT 1", timeout=5)  # notice a dead peer early
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            log.warning("listen_connection_lost", error=repr(exc), retry_in=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
            delay = min(delay * 2, 5.0)
        finally:
            if conn is not None:
                with contextlib.suppress(*UNAVAILABLE, asyncpg.PostgresError):  # it is gone
                    await conn.close(timeout=2)


def _deliver(handler: Handler) -> Callable[[object, int, str, str], None]:
    def callback(_conn: object, _pid: int, channel: str, payload: str) -> None:
        result = handler(payload)
        if asyncio.iscoroutine(result):
            spawn(result, name=f"notice-{channel}")

    return callback
