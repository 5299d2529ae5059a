"""Build a server's parts, each given only what it uses, and the Runtime that holds them.

The order is the dependency order: the limits in force and the cache of callers first, then
the hub (which reads them), then the watch (which pokes the hub), then the frozen Runtime.
The app is made from the Runtime afterwards (`api.app.create_app`); no part needs the app:
a job's relayed call runs through the app serving its worker's socket.
"""

from service.api.caller_cache import CallerCache
from service.api.channel.hub import Hub
from service.api.followers import Followers
from service.api.jwks import Jwks
from service.api.limits_watch import InForceHere, Watch
from service.api.runtime import Runtime
from service.config import Config
from service.db.embedded import Embedded
from service.db.engine import Database
from service.domain.artifacts.server_store import ServerStore
from service.metrics import Metrics
from service.protocol import CasAccess


def assemble(
    config: Config,
    db: Database,
    *,
    server_id: str,
    version: str,
    secret_key: bytes = b"",
    builtin_token: str = "",
    cas: ServerStore | None = None,
    cas_access: CasAccess | None = None,
    embedded: Embedded | None = None,
) -> Runtime:
    """The Runtime of one server: its hub, limits watch, callers, JWKS and followers, built once."""
    in_force = InForceHere(config)
    callers = CallerCache()
    metrics = Metrics()  # this process's own registry
    metrics.count_statements(db.engine)
    hub = Hub(db, server_id, config.executor, in_force, secret_key, callers.forget, metrics)
    metrics.watch(sessions=lambda: len(hub.sessions.ids()))
    proxy = config.network.proxy
    return Runtime(
        config=config,
        db=db,
        server_id=server_id,
        version=version,
        hub=hub,
        limits_watch=Watch(db, config, in_force, on_change=hub.poke),
        callers=callers,
        secret_key=secret_key,
        builtin_token=builtin_token,
        jwks=Jwks(proxy.jwks_url) if proxy.verify_jwt else None,
        cas=cas,
        cas_access=cas_access,
        embedded=embedded,
        metrics=metrics,
        followers=Followers(),
    )
