"""BerthError -> HTTP status with a JSON body, in one place. Anything else is logged as a bug."""

from typing import Any

import structlog
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR
from sqlalchemy.exc import DBAPIError

from service.core.errors import BerthError
from service.db.engine import is_unavailable

log = structlog.get_logger(__name__)


def body(message: str, status: int, **extra: object) -> Response[dict[str, object]]:
    return Response({"error": message, "status": status, **extra}, status_code=status)


def berth_error(_: Request[Any, Any, Any], exc: BerthError) -> Response[dict[str, object]]:
    return body(exc.message, exc.status)


def validation_error(
    _: Request[Any, Any, Any], exc: ValidationException
) -> Response[dict[str, object]]:
    return body(str(exc.detail), 400, detail=exc.extra)


def http_error(_: Request[Any, Any, Any], exc: HTTPException) -> Response[dict[str, object]]:
    return body(str(exc.detail), exc.status_code)


def unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, object]]:
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
