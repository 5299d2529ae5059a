"""What one running server holds: its config, database, identity and the local worker hub."""

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from service.api.followers import Followers
from service.auth.callers import Caller
from service.config import Config
from service.core.placement import PoolSpec, Quotas
from service.db.embedded import Embedded
from service.db.engine import Database
from service.domain.artifacts.server_store import ServerStore
from service.domain.limits import InForce
from service.metrics import Metrics
from service.protocol import CasAccess

if TYPE_CHECKING:  # these import this module
    from service.api.channel.hub import Hub
    from service.api.jwks import Jwks


@dataclass
class Runtime:
    config: Config
    db: Database
    server_id: str
    version: str
    # What the dispatcher and the routes use: berth.toml's pools with the operator limits
    # (`limits`, below) once they are read; `config` stays berth.toml.
    pools: dict[str, PoolSpec] = field(default_factory=dict)
    secret_key: bytes = b""  # AES-GCM key for secrets at rest (domain/secrets.load_key)
    # The built-in worker's token: minted at start, held only in this process's memory.
    builtin_token: str = ""
    jwks: "Jwks | None" = None  # the issuer's keys, when verify_jwt
    cas: ServerStore | None = None  # the artifact store (None: this server offers none)
    cas_access: CasAccess | None = None  # how workers reach it (their welcome says)
    embedded: Embedded | None = None  # the Postgres this server keeps up, when it has no URL
    # token sha256 -> (caller, monotonic expiry): saves a transaction per request. Revocation
    # drops entries on every server at once (NOTIFY); the TTL bounds what a lost NOTIFY costs.
    callers: dict[bytes, tuple[Caller, float]] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=Metrics)  # this process's own registry
    followers: Followers = field(default_factory=Followers)  # of job event streams, by job

    def forget_caller(self, name: str) -> None:
        for digest, (caller, _) in list(self.callers.items()):
            if caller.name == name:
                del self.callers[digest]

    def __post_init__(self) -> None:
        self.limits = InForce.of(self.config)  # berth.toml alone until the first read
        self.quotas = self.limits.config.quotas()

    @property
    def effective(self) -> Config:
        """berth.toml with the operator limits in force on this server."""
        return self.limits.config

    hub: "Hub | None" = None
    app: object = None  # the Litestar app serving this runtime (set by create_app)
    # The limits as this server last read them, and `pools` made from them (api/limits_watch.py).
    limits: InForce = field(init=False)
    quotas: Quotas = field(init=False)  # the tenants' quotas in `limits`, for the claim
    limits_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def the_hub(self) -> "Hub":
        assert self.hub is not None, "the hub is created with the app"
        return self.hub
