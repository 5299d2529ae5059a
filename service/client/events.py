"""Follow a job's event stream (GET /api/v1/jobs/{id}/events), pushed by the server, not polled.

A dropped connection (a server restart, a proxy timeout) is dialled again, resuming after the
last output chunk seen: no output is repeated or lost, and the job's end is never missed. The
server sends the job's state again on each connection; `follow` passes on only a changed one.
`BerthClient.follow_events` and `AsyncBerthClient.follow_events` are the ways in.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Iterator

import httpx

from service import events
from service.client import calls
from service.client.calls import Encoding
from service.client.errors import Unreachable, error_of
from service.events import EndEvent, JobEvent, OutputEvent, StateEvent

# Answers that mean "the server is (re)starting or a proxy lost it": try again.
RETRY_STATUS = frozenset({502, 503, 504})
GIVE_UP_AFTER = 600.0  # seconds unreachable in a row before `Unreachable`


class _Resume:
    """Where a stream stands across connections: the last chunk seen, the last state passed on."""

    def __init__(self, after: int, give_up_after: float) -> None:
        self.after = after
        self.last: StateEvent | None = None
        self.give_up_after = give_up_after
        self.delay = 0.2
        self.down_since: float | None = None
        self.ever_opened = False  # a server never reached is not waited for: it may not exist

    def opened(self, r: httpx.Response) -> None:
        """Check that `r` is the stream: else ApiError, or a TransportError to dial again.

        A proxy's 502, a restarting server's 503 are worth dialling again for; the body of an
        answer that is not the stream has been read.
        """
        if r.status_code in RETRY_STATUS:
            raise httpx.RemoteProtocolError(f"HTTP {r.status_code}")
        if r.status_code != 200:
            raise error_of(r)  # a 404, a 401...
        self.down_since, self.delay = None, 0.2
        self.ever_opened = True

    def passes(self, event: JobEvent) -> bool:
        """Whether the caller sees `event` (a state it already saw, sent again on reconnect: no)."""
        if isinstance(event, OutputEvent):
            self.after = event.id
        elif isinstance(event, StateEvent):
            if event == self.last:
                return False
            self.last = event
        return True

    def pause(self, exc: Exception | None) -> float:
        """Seconds to wait before dialling again; Unreachable once down for too long.

        Unreachable at once when no server answered the first dial, as for every other call.
        """
        if isinstance(exc, httpx.ConnectError) and not self.ever_opened:
            raise Unreachable(str(exc)) from exc
        if exc is not None:
            now = time.monotonic()
            self.down_since = self.down_since or now
            if now - self.down_since > self.give_up_after:
                raise Unreachable(str(exc)) from exc
        delay = self.delay
        self.delay = min(self.delay * 2, 2.0)
        return delay


def follow(
    http: httpx.Client,
    job_id: int,
    *,
    after: int = 0,
    encoding: Encoding = "text",
    output: bool = True,
    give_up_after: float = GIVE_UP_AFTER,
) -> Iterator[JobEvent]:
    """The job's events until its `end`, the last one yielded.

    An answer that is not the stream (a 404, a 401...) raises `ApiError`; unreachable for
    `give_up_after` seconds in a row raises `Unreachable`.
    """
    at = _Resume(after, give_up_after)
    while True:
        failed: Exception | None = None
        call = calls.job_events(job_id, after=at.after, encoding=encoding, output=output)
        try:
            r = http.send(call.request(http), stream=True)
            try:
                if r.status_code != 200:
                    r.read()
                at.opened(r)
                for event in _parse(r.iter_lines()):
                    if at.passes(event):
                        yield event
                    if isinstance(event, EndEvent):
                        return
            finally:
                r.close()
        except httpx.TransportError as exc:
            failed = exc
        # The stream ended without `end` or could not be opened: dial again after a pause.
        time.sleep(at.pause(failed))


async def follow_async(
    http: httpx.AsyncClient,
    job_id: int,
    *,
    after: int = 0,
    encoding: Encoding = "text",
    output: bool = True,
    give_up_after: float = GIVE_UP_AFTER,
) -> AsyncIterator[JobEvent]:
    """`follow` for asyncio."""
    at = _Resume(after, give_up_after)
    while True:
        failed: Exception | None = None
        call = calls.job_events(job_id, after=at.after, encoding=encoding, output=output)
        try:
            r = await http.send(call.request(http), stream=True)
            try:
                if r.status_code != 200:
                    await r.aread()
                at.opened(r)
                async for line in r.aiter_lines():
                    for event in _parse((line,)):
                        if at.passes(event):
                            yield event
                        if isinstance(event, EndEvent):
                            return
            finally:
                await r.aclose()
        except httpx.TransportError as exc:
            failed = exc
        await asyncio.sleep(at.pause(failed))


def _parse(lines: Iterable[str]) -> Iterator[JobEvent]:
    """Events from SSE lines: a `data:` line each (berth sends one), keepalive comments skipped."""
    for line in lines:
        if line.startswith("data:"):
            yield events.decode(line[len("data:") :].strip())
