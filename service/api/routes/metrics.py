"""GET /metrics: this server's Prometheus exposition (operator and up, or a `metrics` caller)."""

from typing import Any

from litestar import Request, Response, get

from service.api.identity import runtime_of
from service.auth.permissions import Perm
from service.domain import gauges
from service.metrics import CONTENT_TYPE


@get("/metrics", opt={"perm": Perm.METRICS}, include_in_schema=False)
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Counters of this process, and gauges read from Postgres now (the same on every server)."""
    rt = runtime_of(request)
    rt.metrics.refresh(await gauges.snapshot(rt.db), limits=len(rt.limits.records))
    return Response(rt.metrics.render(), media_type=CONTENT_TYPE)
