"""What one running server holds: its config, database, identity, and the parts built for it.

A frozen value, built once by `api.assembly.assemble` before the app exists; nothing is set on
it afterwards. What changes while the server runs lives inside the parts that own it: the
limits in force (`limits_watch`), the cache of callers, the hub's sessions.
"""

from dataclasses import dataclass, field

from service.api.caller_cache import CallerCache
from service.api.channel.hub import Hub
from service.api.followers import Followers
from service.api.jwks import Jwks
from service.api.limits_watch import Watch
from service.config import Config
from service.core.placement import PoolSpec, Quotas
from service.db.embedded import Embedded
from service.db.engine import Database
from service.domain.artifacts.server_store import ServerStore
from service.domain.limits import InForce
from service.domain.queued import QueuedSeen
from service.metrics import Metrics
from service.protocol import CasAccess


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    config: Config  # berth.toml as loaded; `effective` has the operator limits applied
    db: Database
    server_id: str
    version: str
    hub: Hub  # the workers attached to this server (api/channel/)
    limits_watch: Watch  # the operator limits in force here, kept fresh
    callers: CallerCache
    secret_key: bytes = b""  # AES-GCM key for secrets at rest (domain/secrets.load_key)
    # The built-in worker's token: minted at start, held only in this process's memory.
    builtin_token: str = ""
    jwks: Jwks | None = None  # the issuer's keys, when verify_jwt
    cas: ServerStore | None = None  # the artifact store (None: this server offers none)
    cas_access: CasAccess | None = None  # how workers reach it (their welcome says)
    embedded: Embedded | None = None  # the Postgres this server keeps up, when it has no URL
    metrics: Metrics  # this process's own registry (/metrics)
    followers: Followers  # of the job event streams, by job (fed by NOTIFY berth_job_events_v1)
    queued: QueuedSeen = field(default_factory=QueuedSeen)  # the tenants' queues as last counted

    @property
    def limits(self) -> InForce:
        """The limits as this server last read them."""
        return self.limits_watch.state.limits

    @property
    def pools(self) -> dict[str, PoolSpec]:
        """What the dispatcher and the routes use: berth.toml's pools with the limits in force."""
        return self.limits_watch.state.pools

    @property
    def quotas(self) -> Quotas:
        """The tenants' quotas in the limits in force, for the claim."""
        return self.limits_watch.state.quotas

    @property
    def effective(self) -> Config:
        """berth.toml with the operator limits in force on this server."""
        return self.limits_watch.state.effective

    def forget_caller(self, name: str) -> None:
        self.callers.forget(name)
