"""What every UI page shares: the template engine, the caller's context, errors as pages."""

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from jinja2 import Environment, PackageLoader, StrictUndefined
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Redirect, Template
from litestar.template.config import TemplateConfig

from service.api import errors
from service.api.identity import identify, runtime_of
from service.api.ui import session
from service.auth.callers import Caller
from service.auth.permissions import Perm, allowed
from service.core.errors import BerthError, Unauthenticated

log = structlog.get_logger(__name__)

STATIC = Path(__file__).with_name("static")
AnyRequest = Request[Any, Any, Any]


def _ago(when: datetime | None) -> str:
    if when is None:
        return "-"
    seconds = max(0.0, (datetime.now(UTC) - when).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def _size(n: int | None) -> str:
    if n is None or n < 0:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("service.api.ui", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
    )
    env.filters["ago"] = _ago
    env.filters["size"] = _size
    env.tests["startingwith"] = lambda value, prefix: str(value).startswith(prefix)
    return env


TEMPLATES = TemplateConfig(instance=JinjaTemplateEngine.from_environment(_environment()))


def proxy_mode(request: AnyRequest) -> bool:
    return runtime_of(request).config.network.auth == "proxy"


def bound_to(request: AnyRequest, caller: Caller) -> str:
    """What this browser's CSRF token is bound to: its session cookie, or the proxy's caller."""
    if proxy_mode(request):
        return f"proxy:{caller}:{caller.role}"
    return "session:" + request.cookies.get(session.COOKIE, "")


async def page(request: AnyRequest, name: str, **context: Any) -> Template:  # noqa: ANN401
    """Render `name` with what every page needs: the caller, what it may do, its CSRF token."""
    caller = await identify(request)
    rt = runtime_of(request)
    return Template(
        template_name=name,
        context={
            "caller": caller,
            "may": {p.name.lower(): allowed(caller, p) for p in Perm},
            "csrf": session.csrf_token(rt.secret_key, bound_to(request, caller)),
            "proxy": proxy_mode(request),
            "path": request.url.path,
            **context,
        },
        media_type="text/html",
    )


def _fragment(request: AnyRequest) -> bool:
    return request.headers.get("hx-request") == "true"


def error_page(request: AnyRequest, exc: Exception) -> Response[Any]:
    """A refusal or a bug as a page (or an htmx fragment), with the status the API would give."""
    if isinstance(exc, Unauthenticated) and not proxy_mode(request):
        if _fragment(request):
            return Response("signed out: reload", status_code=401, media_type="text/plain")
        return Redirect("/ui/login", status_code=303)
    if isinstance(exc, BerthError):
        status, message = exc.status, exc.message
    elif isinstance(exc, ValidationException):
        status, message = 400, str(exc.detail)
    elif isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    else:
        answer = errors.unexpected(request, exc)
        status, message = int(answer.status_code or 500), str(answer.content["error"])
    if _fragment(request):
        return Response(message, status_code=status, media_type="text/plain")
    return Template(
        template_name="error.html",
        context={"status": status, "message": message, "caller": None, "path": ""},
        status_code=status,
        media_type="text/html",
    )


# The same keys as the API's (api/errors.py), so these win over those for UI routes.
ERRORS: Any = {
    BerthError: error_page,
    ValidationException: error_page,
    HTTPException: error_page,
    Exception: error_page,
}
