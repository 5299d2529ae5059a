"""The events of GET /api/v1/jobs/{id}/events, shared by the server and its clients (msgspec only).

Each is one server-sent event: `event:` is the struct's tag, `data:` the struct as JSON (with the
tag as `type`); an output event's SSE `id:` is the chunk id a client resumes after.
"""

from typing import Literal

import msgspec


class StateEvent(msgspec.Struct, tag_field="type", tag="state", kw_only=True, frozen=True):
    """The job moved: queued (and what it waits for), leased on a worker, running, ended."""

    state: str
    attempt: int
    worker: str | None
    waiting_for: str
    exit_code: int | None
    error: str


class OutputEvent(msgspec.Struct, tag_field="type", tag="output", kw_only=True, frozen=True):
    """One chunk of output; `data` (text, invalid UTF-8 replaced) or `b64` (exact bytes)."""

    id: int
    stream: Literal["stdout", "stderr"]
    data: str | None = None
    b64: str | None = None


class EndEvent(msgspec.Struct, tag_field="type", tag="end", kw_only=True, frozen=True):
    """The job ended and every chunk of its output was sent; the stream closes."""

    state: str
    exit_code: int | None
    error: str


JobEvent = StateEvent | OutputEvent | EndEvent
decode = msgspec.json.Decoder(JobEvent).decode
