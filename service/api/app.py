"""create_app(runtime) -> Litestar. The runtime is passed in; nothing is read at import."""

from litestar import Litestar

from service.api import body, deps, errors, guards, openapi
from service.api.channel import socket as worker_socket
from service.api.channel.hub import Hub
from service.api.routes import (
    approvals,
    audit,
    cas,
    fleet,
    health,
    jobs,
    joining,
    limits,
    secrets,
    tokens,
)
from service.api.runtime import Runtime

ROUTES = [
    health.healthz,
    health.readyz,
    jobs.submit,
    jobs.list_jobs,
    jobs.show,
    jobs.cancel,
    jobs.logs,
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
    *cas.HANDLERS,
    worker_socket.attach,
]


def create_app(rt: Runtime) -> Litestar:
    if rt.hub is None:
        rt.hub = Hub(rt)
    app = Litestar(
        route_handlers=ROUTES,
        guards=[guards.require_perm],
        dependencies=deps.DEPENDENCIES,
        request_class=body.StrictRequest,
        exception_handlers=errors.HANDLERS,  # type: ignore[arg-type]
        openapi_config=openapi.config(rt.config, rt.version),
        state={"runtime": rt},  # type: ignore[arg-type]
        debug=False,
        logging_config=None,  # structlog is configured by `berth serve` (service.log)
    )
    rt.app = app  # jobs' relayed calls run through it (api/channel/relay.py)
    return app
