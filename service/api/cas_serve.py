"""`berth cas serve`: the configured store over the HTTP store contract, for the installation.

The contract is service/cas/http.py's docstring, under `/cas`: `.id`, `.list`, HEAD, GET (with
ranges, whole reads verified as they stream), PUT (checked against the name) and DELETE. There
are no tenants here: it answers only the installation's servers and workers, which present
`server_store.serve_key(secret key)` as their bearer (a server derives it; a worker gets it in its
welcome), compared in constant time. A missing key is 401, a wrong one 403; no tenant holds it,
so tenants reach blobs only through a server's /api/v1/cas (SPEC 3).
"""

import hmac
from collections.abc import AsyncGenerator
from typing import Any

from litestar import Litestar, Request, Response, delete, get, head, put
from litestar.handlers.base import BaseRouteHandler
from litestar.params import FromPath
from litestar.response import Stream

from service.api import cas_wire, errors
from service.api.identity import Conn, bearer
from service.core.errors import Forbidden, NotFound, Unauthenticated
from service.domain.artifacts import blobs
from service.domain.artifacts.server_store import ServerStore

BASE = "/cas"
BLOB = f"{BASE}/{{sha256:str}}"


def _server(connection: Conn) -> ServerStore:
    server = connection.app.state["cas"]
    assert isinstance(server, ServerStore)
    return server


async def _installation_only(connection: Conn, _: BaseRouteHandler) -> None:
    """The bearer must be the installation's key (constant-time compare)."""
    presented = bearer(connection)
    if not presented:
        raise Unauthenticated("missing bearer key (the installation's `berth cas serve` key)")
    key = connection.app.state["key"]
    if not hmac.compare_digest(presented.encode(), key.encode()):
        raise Forbidden("this key is not the installation's")


@get(f"{BASE}/.id")
async def store_id(request: Request[Any, Any, Any]) -> Response[str]:
    return cas_wire.store_id(await _server(request).id())


@get(f"{BASE}/.list")
async def list_blobs(request: Request[Any, Any, Any]) -> Stream:
    """One `<sha256> <size>` line per blob, streamed as the store lists them."""
    server = _server(request)

    async def lines() -> AsyncGenerator[bytes, None]:
        async for name, size in server.store.list():
            yield f"{name} {size}\n".encode()

    return Stream(lines(), media_type="text/plain")


@head(BLOB)
async def stat_blob(request: Request[Any, Any, Any], sha256: FromPath[str]) -> Response[None]:
    return cas_wire.head(await blobs.size_of(_server(request), sha256))


@get(BLOB)
async def get_blob(request: Request[Any, Any, Any], sha256: FromPath[str]) -> Response[Any]:
    server = _server(request)
    size = await blobs.size_of(server, sha256)
    return await cas_wire.send(server, sha256, size, request.headers.get("range"))


@put(BLOB, request_max_body_size=None)  # streamed to the store: any size
async def put_blob(
    request: Request[Any, Any, Any], sha256: FromPath[str]
) -> Response[dict[str, Any]]:
    result = await blobs.write(_server(request), sha256, request.stream())
    return cas_wire.stored(result)


@delete(BLOB, status_code=204)
async def delete_blob(request: Request[Any, Any, Any], sha256: FromPath[str]) -> None:
    if not await blobs.delete(_server(request), sha256):
        raise NotFound(f"no blob {sha256}")


def create_app(server: ServerStore, *, key: str) -> Litestar:
    """The app serving `server` to holders of `key`."""
    return Litestar(
        route_handlers=[store_id, list_blobs, stat_blob, get_blob, put_blob, delete_blob],
        guards=[_installation_only],
        exception_handlers={**errors.HANDLERS, **cas_wire.ERRORS},  # type: ignore[dict-item]
        openapi_config=None,
        state={"cas": server, "key": key},  # type: ignore[arg-type]
        debug=False,
        logging_config=None,  # structlog is configured by `berth cas serve` (service.log)
    )
