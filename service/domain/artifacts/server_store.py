"""The server's artifact store: opened from `[cas]`, its id, and how workers reach it.

A server holds the blobs itself (`local`, `s3`) or reaches the installation's `berth cas serve`
(`http`, `cached`) with a key derived from the installation's secret key. A worker's welcome
says how it reaches the store; a tenant-bound worker only ever through this server.
"""

from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from service import protocol
from service.cas import base, factory
from service.cas.http import NO_HEADERS
from service.config import Config
from service.core.errors import Invalid

DAY = 86400.0
WORKER_PATH = "/api/v1/workers/cas"  # the workers' base URL under the server's
SERVE_KEY_INFO = b"berth cas serve v1"


@dataclass
class ServerStore:
    """The server's store and how long references hold blobs in it.

    `heals`: the blobs are here (local, s3), so a corrupt one is removed on sight; a remote
    (http, cached) removes its own.
    """

    store: base.Store
    heals: bool
    gc_days: float
    _id: str | None = field(default=None, repr=False)

    @property
    def gc(self) -> float:
        """Seconds a reference holds its blob after what made it ended."""
        return self.gc_days * DAY

    async def id(self) -> str:
        if self._id is None:
            self._id = await self.store.id()
        return self._id


def serve_key(secret_key: bytes) -> str:
    """The bearer key of `berth cas serve`: derived from the installation's secret key."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=SERVE_KEY_INFO)
    return hkdf.derive(secret_key).hex()


def open_server_store(config: Config, *, home: Path, secret_key: bytes) -> ServerStore:
    """The store `[cas]` names (default: a folder under $BERTH_HOME/cas, 0700). No I/O yet."""
    cas = config.cas
    remote = cas.provider in ("http", "cached")
    headers = {"Authorization": f"Bearer {serve_key(secret_key)}"} if remote else NO_HEADERS
    try:
        store = factory.open_store(cas, home=home, headers=headers)
    except ValueError as exc:
        raise Invalid(str(exc)) from None
    return ServerStore(store=store, heals=not remote, gc_days=cas.gc_days)


async def access(
    config: Config, server: ServerStore, *, server_url: str, secret_key: bytes
) -> protocol.CasAccess:
    """How a worker reaches this server's store: the CasAccess of its welcome."""
    cas = config.cas
    store_id = await server.id()
    match cas.provider:
        case "local":  # through this server, with the worker's own credential
            url = server_url.rstrip("/") + WORKER_PATH
            return protocol.CasAccess(id=store_id, provider="http", url=url, token="")
        case "http" | "cached":  # the remote `berth cas serve`, with the installation's key
            token = serve_key(secret_key)
            return protocol.CasAccess(id=store_id, provider="http", url=cas.url, token=token)
        case "s3":
            return protocol.CasAccess(
                id=store_id,
                provider="s3",
                bucket=cas.bucket,
                prefix=cas.prefix,
                endpoint_url=cas.endpoint_url,
                region=cas.region,
            )
    raise Invalid(f"cas.provider: unknown store {cas.provider!r}")


def for_worker(access: protocol.CasAccess, tenants: list[str]) -> protocol.CasAccess:
    """The store access a worker's welcome carries.

    A tenant-bound worker reaches the store only through this server, which limits it to its
    tenants' blobs; the store's own key (or bucket) would reach every tenant's.
    """
    if not tenants or (access.provider == "http" and access.url.startswith("/")):
        return access
    return protocol.CasAccess(id=access.id, provider="http", url=WORKER_PATH, token="")
