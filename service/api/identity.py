"""Who is calling: a bearer token (token mode). The proxy's claims come in with proxy mode.

Security: in token mode the claim headers are never read, whatever a client sends.
"""

import uuid
from typing import Any

import structlog
from litestar.connection import ASGIConnection

from service.api.runtime import Runtime
from service.auth.callers import Caller
from service.core.errors import Unauthenticated
from service.domain import tokens

Conn = ASGIConnection[Any, Any, Any, Any]


def runtime_of(connection: Conn) -> Runtime:
    rt = connection.app.state["runtime"]
    assert isinstance(rt, Runtime)
    return rt


async def identify(connection: Conn) -> Caller:
    """Resolve the caller once per connection; raise Unauthenticated with a reason."""
    cached = connection.scope.get("state", {}).get("caller")
    if isinstance(cached, Caller):
        return cached
    rt = runtime_of(connection)
    header = connection.headers.get("authorization", "")
    scheme, _, credential = header.partition(" ")
    if scheme.lower() != "bearer" or not credential:
        raise Unauthenticated("missing bearer token (Authorization: Bearer brt_…)")
    caller = await tokens.authenticate(rt.db, credential.strip())
    connection.scope.setdefault("state", {})["caller"] = caller
    request_id = connection.headers.get("x-request-id") or uuid.uuid4().hex
    connection.scope["state"]["request_id"] = request_id
    structlog.contextvars.bind_contextvars(caller=str(caller), request_id=request_id)
    return caller


def request_id(connection: Conn) -> str:
    return str(connection.scope.get("state", {}).get("request_id", ""))
