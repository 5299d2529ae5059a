"""The HTTP store contract (service/cas/http.py's docstring) on the serving side.

Shared by /api/v1/cas, /api/v1/workers/cas and `berth cas serve`. Bodies stream both ways: a
PUT goes from `request.stream()` into the store chunk by chunk, a GET is a `Stream` of the
store's chunks with its Content-Length set, so no blob is ever held in memory. A whole read is
verified as it streams: a corruption the store finds before the first byte is a 422 answer;
one found later makes the stream raise, and the server drops the connection before the last
bytes (the client then sees a short body, never a complete wrong blob).
"""

import re
from typing import Any, cast

import structlog
from litestar import Request, Response
from litestar.enums import MediaType
from litestar.response import Stream
from litestar.types import ExceptionHandlersMap

from service.api import errors
from service.cas import base
from service.core.errors import Invalid
from service.domain.artifacts import blobs
from service.domain.artifacts.blobs import Stored
from service.domain.artifacts.server_store import ServerStore

log = structlog.get_logger(__name__)

OCTETS = "application/octet-stream"
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """[start, end) of a `Range: bytes=A-B`, `bytes=A-` or `bytes=-N`; None: the whole blob.

    (size, size) when the range starts at or past the end (answered 416); Invalid (400) for
    anything else, several ranges included.
    """
    if header is None:
        return None
    m = _RANGE.fullmatch(header.strip())
    if m is None or not (m[1] or m[2]):
        raise Invalid(f"bad range {header[:100]!r}: use bytes=A-B, bytes=A- or bytes=-N")
    if not m[1]:  # the last N bytes
        n = int(m[2])
        return (size, size) if n == 0 else (max(0, size - n), size)
    start = int(m[1])
    if m[2] and int(m[2]) < start:
        raise Invalid(f"bad range {header[:100]!r}: it ends before it starts")
    if start >= size:
        return (size, size)
    end = min(int(m[2]) + 1, size) if m[2] else size
    return start, end


async def send(
    server: ServerStore, sha256: str, size: int, range_header: str | None
) -> Response[Any]:
    """The answer to a GET of a blob of `size` bytes: 200 whole, 206 a range, 416."""
    wanted = byte_range(range_header, size)
    if wanted is None:
        chunks = await blobs.read(server, sha256)
        return Stream(chunks, media_type=OCTETS, headers={"content-length": str(size)})
    start, end = wanted
    if start >= size:
        return Response(
            b"", status_code=416, media_type=OCTETS, headers={"content-range": f"bytes */{size}"}
        )
    chunks = await blobs.read(server, sha256, start=start, end=end)
    return Stream(
        chunks,
        status_code=206,
        media_type=OCTETS,
        headers={
            "content-length": str(end - start),
            "content-range": f"bytes {start}-{end - 1}/{size}",
        },
    )


def head(size: int) -> Response[None]:
    """The answer to a HEAD of a blob: its size as Content-Length, no body."""
    # Empty bytes, not None: Litestar cannot render None as application/octet-stream.
    answer = Response(b"", media_type=OCTETS, headers={"content-length": str(size)})
    return cast("Response[None]", answer)


def stored(result: Stored) -> Response[dict[str, Any]]:
    """The answer to a PUT, once the blob is durable: 201 stored, 200 it was there.

    Only for the installation (`berth cas serve`): a tenant must not learn from it whether
    another tenant stored the same bytes (`kept`).
    """
    return Response(
        {"sha256": result.sha256, "size": result.size},
        status_code=201 if result.created else 200,
    )


def kept(result: Stored) -> Response[dict[str, Any]]:
    """The answer to a tenant's (or worker's) PUT, once the blob is durable: always 201.

    Security: the same status and body whether or not the store had the blob, so a tenant
    cannot confirm a guess of another tenant's file by uploading it.
    """
    return Response({"sha256": result.sha256, "size": result.size}, status_code=201)


def content_length(request: Request[Any, Any, Any]) -> int | None:
    """The body's declared length; None when not given (chunked) or not a number."""
    raw = request.headers.get("content-length", "")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 20 else None


def store_id(store_id: str) -> Response[str]:
    return Response(store_id + "\n", media_type=MediaType.TEXT)


def _cas_error(_: Request[Any, Any, Any], exc: base.CasError) -> Response[dict[str, object]]:
    """A store failure the domain did not turn into a BerthError."""
    if isinstance(exc, base.BadName):
        return errors.body(str(exc), 400)
    if isinstance(exc, base.Missing):
        return errors.body(str(exc), 404)
    if isinstance(exc, base.Corrupt):
        return errors.body(str(exc), 422)
    # Generic to the caller (the store's URL or bucket is not theirs to see); the log has it.
    log.error("cas_store_failed", error=str(exc))
    return errors.body("the artifact store failed; retry shortly (the server logged why)", 503)


ERRORS: ExceptionHandlersMap = {base.CasError: _cas_error}
