"""HTTP requests counted for /metrics, by method, route template and status (never the path)."""

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import Metrics


def count_requests(metrics: Metrics) -> "type[_Counting]":
    """A Litestar middleware (a factory of ASGI apps) counting into `metrics`."""

    class Counting(_Counting):
        target = metrics

    return Counting


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class _Counting:
    target: Metrics

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        status = 500  # what the client gets when the handler raises past every handler

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("path_template") or "unmatched"
            method = str(scope.get("method", ""))
            shown = method if method in _METHODS else "other"
            self.target.requests.labels(shown, route, str(status)).inc()
