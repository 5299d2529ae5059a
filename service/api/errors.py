"""Every error answer, in one place and one shape: views.ErrorView (`error`, `status`, `field`).

BerthError -> its status; Litestar's own refusals (a parameter or body that does not validate,
an unknown route, a method the route does not have) -> the same shape, keeping their headers
(`Allow` on a 405). Anything else is logged as a bug and answered 500 without detail.
"""

from typing import Any

import structlog
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from sqlalchemy.exc import DBAPIError

from service.api.body import BODY_REQUIRED
from service.core.errors import BerthError
from service.db.engine import is_unavailable
from service.views import ErrorView

log = structlog.get_logger(__name__)

SOURCES = {"query": "query parameter", "path": "path parameter", "header": "header"}


def body(
    message: str,
    status: int,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response[ErrorView]:
    return Response(
        ErrorView(error=message, status=status, field=field), status_code=status, headers=headers
    )


def berth_error(_: Request[Any, Any, Any], exc: BerthError) -> Response[ErrorView]:
    return body(exc.message, exc.status, exc.field)


def _wire_name(request: Request[Any, Any, Any], key: str) -> str:
    """The name a parameter has on the wire (`state`), not in the handler (`job_state`)."""
    field = request.route_handler.parsed_fn_signature.parameters.get(key)
    kwarg = getattr(field, "kwarg_definition", None)
    return str(getattr(kwarg, "name", None) or getattr(kwarg, "query", None) or key)


def validation_error(
    request: Request[Any, Any, Any], exc: ValidationException
) -> Response[ErrorView]:
    """A parameter or body that does not validate: 400 naming the first field at fault."""
    problems = exc.extra if isinstance(exc.extra, list) else []
    first: dict[str, Any] = problems[0] if problems and isinstance(problems[0], dict) else {}
    key = str(first.get("key") or "") or None
    message = str(first.get("message") or exc.detail)
    raw_source = first.get("source") or ""
    source = str(getattr(raw_source, "value", raw_source))  # Litestar's ParamType, or "body"
    if source == "body" and key == "data":
        # Litestar's own words when the body is absent ("'data'") or its type does not fit.
        message, key = (BODY_REQUIRED if message == "'data'" else f"invalid body: {message}"), None
    elif source in SOURCES and key:
        key = _wire_name(request, key)
        message = f"invalid {SOURCES[source]} {key}: {message}"
    return body(message, 400, key)


def http_error(_: Request[Any, Any, Any], exc: HTTPException) -> Response[ErrorView]:
    return body(str(exc.detail), exc.status_code, headers=exc.headers)


def unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[ErrorView]:
    if isinstance(exc, DBAPIError | OSError) and is_unavailable(exc):
        return body("the database is not reachable; retry shortly", 503)
    log.error("request_failed", path=request.url.path, error=repr(exc), exc_info=exc)
    return body("internal error; it has been logged", HTTP_500_INTERNAL_SERVER_ERROR)


HANDLERS = {
    BerthError: berth_error,
    ValidationException: validation_error,
    HTTPException: http_error,
    Exception: unexpected,
}
