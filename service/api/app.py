"""create_app(runtime) -> Litestar.

The runtime is passed in, built whole (api/assembly.py); nothing is read at import and nothing
is set on the runtime here.
"""

from litestar import Litestar

from service.api import body, deps, errors, guards, observe, openapi, worker_socket
from service.api.routes import (
    approvals,
    audit,
    cas,
    execs,
    fleet,
    health,
    job_events,
    jobs,
    joining,
    limits,
    metrics,
    secrets,
    tokens,
)
from service.api.runtime import Runtime
from service.api.ui import actions as ui_actions
from service.api.ui import render as ui_render
from service.api.ui import routes as ui_routes

ROUTES = [
    health.healthz,
    health.readyz,
    jobs.submit,
    jobs.list_jobs,
    jobs.show,
    jobs.cancel,
    jobs.logs,
    execs.exec_session,
    job_events.events,
    fleet.list_workers,
    fleet.set_worker_state,
    fleet.remove_worker,
    joining.create,
    fleet.pools,
    fleet.status,
    limits.list_limits,
    limits.set_limit,
    limits.unset_limit,
    tokens.create,
    tokens.list_tokens,
    tokens.revoke,
    secrets.set_secret,
    secrets.list_secrets,
    secrets.remove_secret,
    audit.list_audit,
    approvals.ask,
    approvals.list_approvals,
    approvals.show,
    approvals.approve,
    approvals.deny,
    metrics.metrics,
    *ui_routes.HANDLERS,
    *ui_actions.HANDLERS,
    *cas.HANDLERS,
    worker_socket.attach,
]


def create_app(rt: Runtime) -> Litestar:
    deps.resolve_in_order()
    return Litestar(
        route_handlers=ROUTES,
        guards=[guards.require_perm],
        middleware=[observe.count_requests(rt.metrics)],
        template_config=ui_render.TEMPLATES,
        dependencies=deps.DEPENDENCIES,
        request_class=body.StrictRequest,
        exception_handlers=errors.HANDLERS,  # type: ignore[arg-type]
        openapi_config=openapi.config(rt.config, rt.version),
        state={"runtime": rt},  # type: ignore[arg-type]
        debug=False,
        logging_config=None,  # structlog is configured by `berth serve` (service.log)
    )
