"""What handlers take by name: the server's parts, the caller and the request id (Litestar DI).

A handler names a parameter (`db`, `caller`, `request_id`, ...) and Litestar passes the value;
no handler reaches into the app's state by hand. Every provider reads the server through
`runtime()`, the one place that knows where the running server's parts live.

`caller` is resolved once per request by the guard (api/guards.py, through identify(), which
caches it on the connection); the provider hands that same value on. Values that change while
the server runs (the pools and the config with the operator limits in force) are read per
request, so a handler sees the limits in force when it runs.
"""

from collections.abc import Awaitable, Callable
from typing import Any

from litestar import Request
from litestar._kwargs.cleanup import DependencyCleanupGroup
from litestar._kwargs.dependencies import resolve_dependency
from litestar._kwargs.kwargs_model import KwargsModel
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency, Provide

from service.api.followers import Followers
from service.api.identity import identify, runtime_of
from service.api.identity import request_id as request_id_of
from service.api.limits_watch import InForceHere
from service.api.runtime import Runtime
from service.auth import callers
from service.config import Config
from service.core.errors import Unavailable
from service.core.placement import PoolSpec, Quotas
from service.db import embedded
from service.db.engine import Database
from service.domain import limits
from service.domain.artifacts.server_store import ServerStore
from service.domain.queued import QueuedSeen
from service.views import ServerView

Req = Request[Any, Any, Any]


def runtime(request: Req) -> Runtime:
    """The running server's parts: every provider below reads them here, and only here."""
    return runtime_of(request)


async def provide_caller(request: Req) -> callers.Caller:
    return await identify(request)  # cached on the connection by the guard: no second lookup


def provide_request_id(request: Req) -> str:
    return request_id_of(request)


def provide_db(request: Req) -> Database:
    return runtime(request).db


def provide_config(request: Req) -> Config:
    """berth.toml as loaded (not the limits set over it): what the limits are defaults of."""
    return runtime(request).config


def provide_effective(request: Req) -> Config:
    """berth.toml with the operator limits in force on this server now."""
    return runtime(request).effective


def provide_in_force(request: Req) -> limits.InForce:
    """The limits as this server last read them, with berth.toml under them."""
    return runtime(request).limits


def provide_pools(request: Req) -> dict[str, PoolSpec]:
    """The pools in force now (berth.toml's, with the operator limits applied)."""
    return runtime(request).pools


def provide_quotas(request: Req) -> Quotas:
    """The tenants' quotas in the limits this server last read (what the claim holds them to)."""
    return runtime(request).quotas


def provide_limits_here(request: Req) -> InForceHere:
    """The limits in force, kept fresh: for a stream, which outlives its request's moment.

    It reads `.pools` and `.effective` each time it needs them, not once at the start.
    """
    return runtime(request).limits_watch.state


def provide_followers(request: Req) -> Followers:
    """Who follows which job's events on this server, woken by NOTIFY berth_job_events_v1."""
    return runtime(request).followers


def provide_cas(request: Req) -> ServerStore | None:
    """The artifact store, or None when this server offers none."""
    return runtime(request).cas


def provide_store(request: Req) -> ServerStore:
    """The artifact store, for the routes that only serve it: 503 when this server has none."""
    cas = runtime(request).cas
    if cas is None:
        raise Unavailable("this server offers no artifact store")
    return cas


def provide_secret_key(request: Req) -> bytes:
    return runtime(request).secret_key


def provide_embedded(request: Req) -> embedded.Embedded | None:
    """The Postgres this server keeps up itself; None when it was given a database URL."""
    return runtime(request).embedded


def provide_server(request: Req) -> ServerView:
    rt = runtime(request)
    return ServerView(id=rt.server_id, version=rt.version)


def provide_public_url(request: Req) -> str:
    """The URL workers and people reach this server at: [network] url, else this request's."""
    return runtime(request).config.network.url or str(request.base_url).rstrip("/")


def provide_queued(request: Req) -> QueuedSeen:
    """The tenants' queued jobs as this server last counted them (a submit's bound check)."""
    return runtime(request).queued


def provide_poke(request: Req) -> Callable[[], None]:
    """Wake this server's dispatcher now (new jobs need not wait for the NOTIFY round trip)."""
    rt = runtime(request)
    return rt.hub.poke


def provide_forget_caller(request: Req) -> Callable[[str], None]:
    """Drop a credential's cached caller on this server (other servers follow the NOTIFY)."""
    return runtime(request).forget_caller


def provide_refresh_limits(request: Req) -> Callable[[], Awaitable[bool]]:
    """Re-read the limits into this server (True when its pools changed)."""
    return runtime(request).limits_watch.refresh


async def _resolve_in_order(
    self: KwargsModel, connection: ASGIConnection[Any, Any, Any, Any], kwargs: dict[str, Any]
) -> DependencyCleanupGroup:
    cleanup_group = DependencyCleanupGroup()
    for batch in self.dependency_batches:
        for dependency in batch:
            await resolve_dependency(dependency, connection, kwargs, cleanup_group)
    return cleanup_group


def resolve_in_order() -> None:
    """Resolve a handler's dependencies one after another instead of in an anyio task group.

    Why: every provider above is an attribute read or the guard's cached caller, and nothing
    here waits on I/O, so there is nothing to overlap; Litestar resolves a batch of two or more
    in a task group, a task per dependency (litestar-org/litestar#4563), which was 9% of the
    server's CPU on a single submit (seven dependencies). Same values, same order of batches.
    """
    KwargsModel.resolve_dependencies = _resolve_in_order  # type: ignore[method-assign]


def _sync(fn: Callable[..., Any]) -> Provide:
    # Cheap attribute reads: run them on the event loop, not in a thread.
    return Provide(fn, sync_to_thread=False)


DEPENDENCIES: dict[str, Provide] = {
    "caller": Provide(provide_caller),
    "request_id": _sync(provide_request_id),
    "db": _sync(provide_db),
    "config": _sync(provide_config),
    "effective": _sync(provide_effective),
    "in_force": _sync(provide_in_force),
    "pools": _sync(provide_pools),
    "quotas": _sync(provide_quotas),
    "limits_here": _sync(provide_limits_here),
    "followers": _sync(provide_followers),
    "cas": _sync(provide_cas),
    "store": _sync(provide_store),
    "secret_key": _sync(provide_secret_key),
    "embedded": _sync(provide_embedded),
    "server": _sync(provide_server),
    "public_url": _sync(provide_public_url),
    "queued": _sync(provide_queued),
    "poke": _sync(provide_poke),
    "forget_caller": _sync(provide_forget_caller),
    "refresh_limits": _sync(provide_refresh_limits),
}


# What a handler writes for each: `db: deps.Db`, `caller: deps.Caller`, ... (the parameter's
# name is the dependency's key above; the alias marks it as injected, not a query parameter).
Caller = NamedDependency[callers.Caller]
RequestId = NamedDependency[str]
Db = NamedDependency[Database]
BerthToml = NamedDependency[Config]
Effective = NamedDependency[Config]
InForce = NamedDependency[limits.InForce]
Pools = NamedDependency[dict[str, PoolSpec]]
TenantQuotas = NamedDependency[Quotas]
LimitsHere = NamedDependency[InForceHere]
JobFollowers = NamedDependency[Followers]
Cas = NamedDependency[ServerStore | None]
Store = NamedDependency[ServerStore]
SecretKey = NamedDependency[bytes]
Embedded = NamedDependency[embedded.Embedded | None]
Server = NamedDependency[ServerView]
PublicUrl = NamedDependency[str]
Queued = NamedDependency[QueuedSeen]
Poke = NamedDependency[Callable[[], None]]
ForgetCaller = NamedDependency[Callable[[str], None]]
RefreshLimits = NamedDependency[Callable[[], Awaitable[bool]]]
