"""Follow a job's event stream (GET /api/v1/jobs/{id}/events), pushed by the server, not polled.

A dropped connection (a server restart, a proxy timeout) is dialled again, resuming after the
last output chunk seen: no output is repeated or lost, and the job's end is never missed. The
server sends the job's state again on each connection; `follow` passes on only a changed one.
"""

# service/client/__init__.py (the typed client) comes with the h-client branch; until then this
# module lives in a namespace package.
# ruff: noqa: INP001

import time
from collections.abc import Callable, Iterator

import httpx

from service import events
from service.events import EndEvent, JobEvent, OutputEvent, StateEvent

# Answers that mean "the server is (re)starting or a proxy lost it": try again.
RETRY_STATUS = frozenset({502, 503, 504})


class Lost(Exception):
    """The server stayed unreachable for longer than the caller allows."""

    def __init__(self, cause: Exception | str) -> None:
        super().__init__(str(cause))
        self.cause = cause


def follow(
    http: httpx.Client,
    job_id: int,
    *,
    refused: Callable[[httpx.Response], object],
    after: int = 0,
    encoding: str = "text",
    output: bool = True,
    give_up_after: float = 600.0,
) -> Iterator[JobEvent]:
    """The job's events until its `end`, the last one yielded.

    `refused(response)` is called with an answer that is not the stream (a 404, a 401...) and
    must raise. Unreachable for `give_up_after` seconds in a row: `Lost`.
    """
    last: StateEvent | None = None
    delay = 0.2
    down_since: float | None = None
    while True:
        try:
            with http.stream(
                "GET",
                f"/api/v1/jobs/{job_id}/events",
                params={"after": after, "encoding": encoding, "output": output},
                headers={"Accept": "text/event-stream"},
            ) as r:
                if r.status_code in RETRY_STATUS:
                    raise httpx.RemoteProtocolError(f"HTTP {r.status_code}")
                if r.status_code != 200:
                    r.read()
                    refused(r)
                    raise Lost(f"HTTP {r.status_code}")  # `refused` returned: not the stream
                down_since, delay = None, 0.2
                for event in _parse(r.iter_lines()):
                    if isinstance(event, OutputEvent):
                        after = event.id
                    elif isinstance(event, StateEvent):
                        if event == last:
                            continue
                        last = event
                    yield event
                    if isinstance(event, EndEvent):
                        return
        except httpx.TransportError as exc:
            now = time.monotonic()
            down_since = down_since or now
            if now - down_since > give_up_after:
                raise Lost(exc) from None
        # The stream ended without `end` or could not be opened: dial again after a pause.
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def _parse(lines: Iterator[str]) -> Iterator[JobEvent]:
    """Events from SSE lines: a `data:` line each (berth sends one), keepalive comments skipped."""
    for line in lines:
        if line.startswith("data:"):
            yield events.decode(line[len("data:") :].strip())
