"""What the OpenAPI document says beyond the handlers' types: errors, and bodies not in JSON.

A followed output is NDJSON, a job's events are server-sent events and a blob is octet-stream;
the operation classes below say so.

Every error answer is views.ErrorView. `errors(...)` names those an operation can give besides
the ones every operation can: 400 (a parameter or body that does not validate, a NUL in the
URL), and, past the guard, 401 (no or a bad credential), 403 (the role lacks the permission)
and 503 (the database is not reachable). Every in-process API test fails when a route answers
a status its operation does not declare (tests/openapi_check.py, hooked in by
tests/integration/conftest.py).
"""

from dataclasses import dataclass
from typing import Any, cast

from litestar.openapi import ResponseSpec
from litestar.openapi.spec import (
    OpenAPIFormat,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Reference,
    RequestBody,
    Schema,
)

from service.events import JobEvent
from service.views import ErrorView

NDJSON = "application/x-ndjson"
EVENT_STREAM = "text/event-stream"
OCTETS = "application/octet-stream"

WHY = {
    400: "The request is malformed: a parameter or body out of bounds or of the wrong type "
    "(`field` names it), or a NUL in the URL.",
    401: "No credential, or one that is unknown, revoked or expired.",
    403: "The caller may not do this (its role lacks the permission, or the target is not its).",
    404: "The target does not exist, or the caller may not see it (the same answer on purpose).",
    409: "The target is in a state that forbids the change.",
    413: "The body is over a size bound.",
    416: "The range starts at or past the blob's end, or ends before it starts.",
    422: "The body is not what its name says (a blob whose bytes do not hash to its name).",
    429: "The change would pass a bound that protects every tenant from one (the key is named).",
    503: "The database (or the artifact store) is not reachable now; retry shortly.",
}
PUBLIC = (400,)
GUARDED = (400, 401, 403, 503)


def errors(*statuses: int, public: bool = False) -> dict[int, ResponseSpec]:
    """The error answers of an operation: those every one can give, and `statuses`."""
    every = PUBLIC if public else GUARDED
    return {
        status: ResponseSpec(
            data_container=ErrorView, description=WHY[status], generate_examples=False
        )
        for status in sorted({*every, *statuses})
    }


def _bytes(description: str) -> Schema:
    return Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.BINARY, description=description)


@dataclass
class LogsOperation(Operation):
    """GET .../logs: JSON, or with follow=true NDJSON lines (ChunkView ..., then LogEndView)."""

    def __post_init__(self) -> None:
        ok = (self.responses or {}).get("200")
        if isinstance(ok, OpenAPIResponse) and ok.content is not None:
            # The handler's annotation is LogsView | Stream; the JSON answer is a LogsView.
            ok.content["application/json"] = OpenAPIMediaType(
                schema=Reference(ref="#/components/schemas/LogsView")
            )
            ok.content[NDJSON] = OpenAPIMediaType(
                schema=Schema(
                    type=OpenAPIType.STRING,
                    description="With follow=true: one JSON object a line, each a ChunkView, "
                    "then one LogEndView when the job has ended.",
                )
            )


def events(*statuses: int) -> dict[int, ResponseSpec]:
    """The answers of GET .../events: the stream (its events' Structs named), and the errors."""
    stream = ResponseSpec(
        data_container=cast("Any", JobEvent),  # a union of Structs: each one a schema
        media_type=EVENT_STREAM,
        description="Server-sent events until the job ends: `event:` is the type (state, output, "
        "end), `data:` the event as one JSON object; output events carry `id:` (the chunk id, "
        "for Last-Event-ID or `after` on reconnect). Lines starting with ':' are keepalives.",
        generate_examples=False,
    )
    return {200: stream, **errors(*statuses)}


@dataclass
class EventsOperation(Operation):
    """GET .../events: a streamed answer, the server-sent events `events()` declares.

    The schema is of one event as a reader sees it (`event`, `id`, `data`), its `data` a JSON
    document of one of the events' Structs (contentMediaType/contentSchema, JSON Schema 2020-12).
    """

    def __post_init__(self) -> None:
        responses: dict[str, Any] = self.responses or {}
        ok = responses.get("200")
        if isinstance(ok, OpenAPIResponse) and ok.content and EVENT_STREAM in ok.content:
            media = ok.content[EVENT_STREAM]
            text = Schema(type=OpenAPIType.STRING)
            media.schema = Schema(
                type=OpenAPIType.OBJECT,
                properties={
                    "event": Schema(type=OpenAPIType.STRING, enum=["state", "output", "end"]),
                    "id": Schema(type=OpenAPIType.STRING, pattern="^[0-9]+$"),
                    "data": Schema(
                        type=OpenAPIType.STRING,
                        content_media_type="application/json",
                        content_schema=media.schema,
                    ),
                    "retry": text,
                },
                required=["data"],
            )


def _length(description: str) -> OpenAPIHeader:
    return OpenAPIHeader(schema=Schema(type=OpenAPIType.STRING), description=description)


@dataclass
class BlobReadOperation(Operation):
    """GET a blob: 200 the whole blob, 206 a `Range` of it, 416 a range past its end."""

    def __post_init__(self) -> None:
        responses: dict[str, Any] = self.responses or {}
        responses["200"] = OpenAPIResponse(
            description="The whole blob, verified against its name as it streams.",
            content={OCTETS: OpenAPIMediaType(schema=_bytes("the blob"))},
            headers={"content-length": _length("the blob's size in bytes")},
        )
        responses["206"] = OpenAPIResponse(
            description="The bytes the `Range` header asked for.",
            content={OCTETS: OpenAPIMediaType(schema=_bytes("the range"))},
            headers={
                "content-length": _length("the range's size in bytes"),
                "content-range": _length("bytes START-END/SIZE"),
            },
        )
        responses["416"] = OpenAPIResponse(
            description=WHY[416], headers={"content-range": _length("bytes */SIZE")}
        )
        self.responses = responses


@dataclass
class BlobStatOperation(Operation):
    """HEAD a blob: its size as Content-Length, no body."""

    def __post_init__(self) -> None:
        responses: dict[str, Any] = self.responses or {}
        responses["200"] = OpenAPIResponse(
            description="The blob is there: its size is the Content-Length.",
            headers={"content-length": _length("the blob's size in bytes")},
        )
        self.responses = responses


@dataclass
class BlobWriteOperation(Operation):
    """PUT a blob: the body is the blob's bytes, streamed to the store."""

    def __post_init__(self) -> None:
        self.request_body = RequestBody(
            content={OCTETS: OpenAPIMediaType(schema=_bytes("the blob; its sha256 is its name"))},
            required=True,
        )


@dataclass
class TextOperation(Operation):
    """An answer in plain text (the store's id, a line)."""

    def __post_init__(self) -> None:
        responses: dict[str, Any] = self.responses or {}
        responses["200"] = OpenAPIResponse(
            description="The store's id, one line.",
            content={"text/plain": OpenAPIMediaType(schema=Schema(type=OpenAPIType.STRING))},
        )
        self.responses = responses


@dataclass
class PublicOperation(Operation):
    """An operation that answers without a credential (liveness, readiness)."""

    def __post_init__(self) -> None:
        self.security = []
