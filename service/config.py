"""berth's configuration: berth.toml, then BERTH_CONFIG_JSON merged over it.

Nothing here runs at import. `load()` is called once by the CLI and the frozen result is passed
down; no other module reads the environment for settings. Unknown keys are an error naming the
key. Durations are seconds and may be fractional, so tests run with short ones.
"""

import ipaddress
import json
import math
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from service.core import bounds, resources
from service.core.bounds import TenantBounds
from service.core.errors import Invalid
from service.core.placement import PoolSpec, Quota, Quotas


class Section(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """Every section is strict and immutable."""


class Database(Section, frozen=True):
    url: str = ""  # empty: embedded Postgres under $BERTH_HOME/postgres
    # The embedded Postgres (no url): how often `berth serve` checks that it is up, and the
    # longest wait between two restart attempts (the wait doubles from embedded_check_seconds).
    embedded_check_seconds: float = 1.0
    embedded_restart_max_seconds: float = 30.0


class TLSFiles(Section, frozen=True):
    cert: str
    key: str


class Rule(Section, frozen=True):
    when: dict[str, str]
    caller: Literal["human", "service", "worker"] = "human"
    role: Literal["admin", "operator", "member", "viewer", "worker"] | None = None
    tenants: list[str] = msgspec.field(default_factory=list)
    tenants_from: str = ""  # a claim whose values name tenants, e.g. "groups"
    tenant_prefix: str = ""  # ... keeping those with this prefix, prefix removed
    names: str = ""  # worker rules: the worker names this rule's principals may use (a glob)


class Proxy(Section, frozen=True):
    claims: dict[str, str] = msgspec.field(
        default_factory=lambda: {
            "user": "x-auth-request-user",
            "email": "x-auth-request-email",
            "groups": "x-auth-request-groups",
            "principal": "x-jwt-sub",
        }
    )
    name_claims: list[str] = msgspec.field(default_factory=lambda: ["user", "principal"])
    worker_header: str = "x-berth-worker"
    rules: list[Rule] = msgspec.field(default_factory=list)
    # Optionally verify the JWT the proxy forwards and take the claims from it instead.
    verify_jwt: bool = False
    jwt_header: str = "authorization"  # "Bearer <jwt>", or the raw token in another header
    jwks_url: str = ""
    issuer: str = ""
    audience: str = ""
    jwt_claims: dict[str, str] = msgspec.field(
        default_factory=lambda: {
            "user": "preferred_username",
            "email": "email",
            "groups": "groups",
            "principal": "sub",
        }
    )


class Network(Section, frozen=True):
    listen: str = "127.0.0.1:8443"
    url: str = ""  # the address workers dial (provisioned workers)
    tls: str | TLSFiles = ""  # "", "proxy" or {cert, key}
    auth: Literal["token", "proxy"] = "token"
    proxy: Proxy = msgspec.field(default_factory=Proxy)


class Executor(Section, frozen=True):
    heartbeat_seconds: float = 10.0  # a worker beats this often; the server acks each beat
    unreachable_seconds: float = 30.0  # stage 1: silent this long, no new lease
    evict_seconds: float = 60.0  # stage 2: unreachable this long, leases expire (lost at 90 s)
    kill_grace_seconds: float = 5.0  # TERM, then KILL after this long
    credential_rotate_hours: float = 24.0  # a joined worker's credential is replaced this often
    output_tail_kb: float = 256.0  # a job's newest output kept in Postgres; the rest in the store
    pack_seconds: float = 10.0  # how often older output moves to the store (at most 30 s)
    loop_seconds: float = 1.0  # cadence of the leader's silence, sealing and approvals passes
    # A leader loop whose passes fail this many times in a row with an unexpected error (a
    # bug, not the database restarting) stops the server (docs/architecture.md, Errors).
    loop_max_failures: int = 3
    # A dispatch pass runs when NOTIFY or a local event pokes it, and at least this often
    # (host samples move thresholds without any event).
    dispatch_fallback_seconds: float = 2.0
    relay_max_save_gb: float = (
        bounds.RELAY_MAX_SAVE_GB
    )  # what one job may save through its relay (0: nothing)
    relay_max_in_flight: int = 8  # relayed requests in flight per worker session on the server
    forget_lost_after_seconds: float = 86400.0  # a lost or gone worker leaves `worker list`


class Toleration(Section, frozen=True):
    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class Compute(Section, frozen=True):
    """Where a pool's provisioned workers run. Keys another provider would use are refused."""

    provider: Literal["process", "kubernetes", "modal"] = "process"
    # kubernetes and modal: the image with berth installed
    image: str | msgspec.UnsetType = msgspec.UNSET
    # kubernetes
    namespace: str | msgspec.UnsetType = msgspec.UNSET
    api_url: str | msgspec.UnsetType = msgspec.UNSET  # default: in-cluster, else ~/.kube/config
    cpu: str | msgspec.UnsetType = msgspec.UNSET  # "4", "500m" (kubernetes); cores (modal)
    memory: str | msgspec.UnsetType = msgspec.UNSET  # "16Gi" (kubernetes); "16G" (modal)
    gpus: int | msgspec.UnsetType = msgspec.UNSET  # nvidia.com/gpu (kubernetes)
    node_selector: dict[str, str] | msgspec.UnsetType = msgspec.UNSET
    tolerations: list[Toleration] | msgspec.UnsetType = msgspec.UNSET
    service_account: str | msgspec.UnsetType = msgspec.UNSET
    # modal
    app: str | msgspec.UnsetType = msgspec.UNSET
    gpu: str | msgspec.UnsetType = msgspec.UNSET  # "A100", "L4:2"
    region: str | msgspec.UnsetType = msgspec.UNSET
    # every provider: extra environment for the worker (never a credential: those are secrets)
    env: dict[str, str] | msgspec.UnsetType = msgspec.UNSET
    # process: what runs `berth` (default: this interpreter, `-m service`)
    command: list[str] | msgspec.UnsetType = msgspec.UNSET


class Provisioner(Section, frozen=True):
    max: int = 4  # most workers it runs at once
    idle_seconds: float = 300.0  # no lease this long: drained, then stopped
    orphan_exit_seconds: float = 600.0  # a worker that cannot reach a server this long exits
    credential_secret: str = ""  # auth = "proxy": the secret holding the shared credential
    labels: list[str] = msgspec.field(default_factory=list)  # what its workers carry
    compute: Compute = msgspec.field(default_factory=Compute)


MAX_APPROVAL_SECONDS = 366 * 86400.0


class Pool(Section, frozen=True):
    slots: dict[str, int] = msgspec.field(default_factory=lambda: {"default": 2})
    # pools.serve only: the built-in worker of `berth serve`. Default: on with auth = "token",
    # off with auth = "proxy" (SPEC section 4).
    builtin: bool | None = None
    max_load: float = 0.0
    min_memory_gb: float = 0.0
    min_disk_gb: float = 0.0
    # What a job of this pool asks for when it says nothing (SPEC section 4, "Resources").
    default_cpus: float = 0.0
    default_memory: str | int = 0  # a size (512M, 2G; powers of 1024) or MiB
    default_gpus: int = 0
    provisioner: Provisioner | None = None
    # Who may `berth job exec` into this pool's running jobs: "operator" (operators and admins
    # of the job's tenant), "member" (its members too) or "off" (nobody, admins included).
    exec: Literal["operator", "member", "off"] = "operator"
    # Who may answer a job's request_approval: any member of its tenant but the job's creator
    # ("four-eyes"), or any member ("any-member"); unanswered after the timeout, it is denied.
    approvals: Literal["four-eyes", "any-member"] = "four-eyes"
    approval_timeout_seconds: float = 3600.0

    def default_request(self) -> resources.Resources:
        """The request of a job of this pool that asks for nothing (checked by `check`)."""
        return resources.Resources(
            self.default_cpus, resources.parse_size(self.default_memory), self.default_gpus
        )


class Cas(Section, frozen=True):
    provider: Literal["local", "http", "cached", "s3"] = "local"
    root: str = ""  # local/cached: the folder (default $BERTH_HOME/cas)
    url: str = ""  # http/cached: the remote store
    local_max_gb: float = 0.0  # cached: LRU size of the local copy
    bucket: str = ""  # s3
    prefix: str = ""  # s3
    endpoint_url: str = ""  # s3: another S3-compatible service
    region: str = ""  # s3
    gc_days: float = 30.0  # a reference expires this long after what made it ended
    gc_seconds: float = 60.0  # the leader's collector runs this often
    max_blob_gb: float = 50.0  # the largest blob a tenant may upload


class Tenant(Section, frozen=True):
    """`[tenants.NAME]`: one tenant's bounds; a key it does not set takes [tenants.default]'s.

    `[tenants.default]` is every tenant's (core/bounds.py has the built-in defaults).
    """

    max_queued: int | msgspec.UnsetType = msgspec.UNSET  # queued jobs (default 100000)
    max_stored_gb: float | msgspec.UnsetType = msgspec.UNSET  # distinct blobs kept (0: no bound)
    max_running: int | msgspec.UnsetType = msgspec.UNSET  # jobs running at once (0: no quota)
    max_gpus: int | msgspec.UnsetType = msgspec.UNSET  # GPUs held at once (0: no quota)


class Config(Section, frozen=True):
    database: Database = msgspec.field(default_factory=Database)
    network: Network = msgspec.field(default_factory=Network)
    executor: Executor = msgspec.field(default_factory=Executor)
    pools: dict[str, Pool] = msgspec.field(default_factory=dict)
    cas: Cas = msgspec.field(default_factory=Cas)
    tenants: dict[str, Tenant] = msgspec.field(default_factory=dict)

    def tenant_bounds(self, tenant: str) -> TenantBounds:
        """`tenant`'s bounds: [tenants.NAME], else [tenants.default], else the built-in ones."""
        return bounds.of(self, tenant)

    def builtin_worker(self) -> bool:
        """Whether `berth serve` runs its built-in worker (SPEC section 4)."""
        serve = self.pools.get("serve")
        if serve is not None and serve.builtin is not None:
            return serve.builtin
        return self.network.auth == "token"

    def pool_specs(self) -> dict[str, PoolSpec]:
        """Every pool, the built-in `serve` pool included."""
        pools = {"serve": Pool(), **self.pools}
        return {
            name: PoolSpec(
                name=name,
                slots=dict(p.slots),
                max_load=p.max_load,
                min_memory_gb=p.min_memory_gb,
                min_disk_gb=p.min_disk_gb,
                default=p.default_request(),
            )
            for name, p in pools.items()
        }

    def quotas(self) -> Quotas:
        """Every tenant's quotas in force (max_running, max_gpus), for the claim."""

        def quota(tenant: str) -> Quota:
            b = self.tenant_bounds(tenant)
            return Quota(b.max_running, b.max_gpus, b.key("max_running"), b.key("max_gpus"))

        return Quotas(
            default=quota(bounds.DEFAULT),
            tenants={t: quota(t) for t in self.tenants if t != bounds.DEFAULT},
        )


def home(environ: Mapping[str, str] = os.environ) -> Path:
    """$BERTH_HOME, default ~/.berth."""
    return Path(environ.get("BERTH_HOME") or Path.home() / ".berth").expanduser()


def load(path: Path | None = None, *, environ: Mapping[str, str] = os.environ) -> Config:
    """Read `path` (default $BERTH_HOME/berth.toml; may be absent), merge overlays, validate."""
    path = path or home(environ) / "berth.toml"
    raw = _raw(path, environ)
    if url := environ.get("BERTH_DATABASE_URL"):
        raw = merge(raw, {"database": {"url": url}})
    try:
        config = msgspec.convert(raw, Config)
    except (
        msgspec.ValidationError
    ) as exc:  # "Object contains unknown field `lisen` - at `$.network`"
        where = f"{path} with BERTH_CONFIG_JSON" if environ.get("BERTH_CONFIG_JSON") else str(path)
        raise Invalid(f"{where}: {exc}") from None
    try:
        check(config)
    except Invalid as exc:
        if environ.get("BERTH_DATABASE_URL") and exc.message.startswith("database.url"):
            raise Invalid(exc.message.replace("database.url", "BERTH_DATABASE_URL", 1)) from None
        raise
    return config


def load_cas(path: Path | None = None, *, environ: Mapping[str, str] = os.environ) -> Cas:
    """Only the `[cas]` table (a worker's own store), checked on its own.

    The default when there is none. A worker reads nothing else of a config.
    """
    path = path or home(environ) / "berth.toml"
    try:
        cas = msgspec.convert(_raw(path, environ).get("cas", {}), Cas)
    except msgspec.ValidationError as exc:
        raise Invalid(f"{path} [cas]: {exc}") from None
    _check_cas(cas)
    return cas


def _raw(path: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """berth.toml (absent is fine) with BERTH_CONFIG_JSON merged over it, unvalidated."""
    raw: dict[str, Any] = {}
    if path.exists():
        try:
            raw = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise Invalid(f"{path}: {exc}") from None
    if overlay := environ.get("BERTH_CONFIG_JSON"):
        try:
            extra = json.loads(overlay)
        except json.JSONDecodeError as exc:
            raise Invalid(f"BERTH_CONFIG_JSON: {exc}") from None
        if not isinstance(extra, dict):
            raise Invalid("BERTH_CONFIG_JSON: must be a JSON object")
        raw = merge(raw, extra)
    return raw


def check(config: Config) -> None:
    """Rules that span keys; raise Invalid naming the key."""
    split_listen(config.network.listen)
    if config.database.url:
        check_database_url(config.database.url)
    _check_executor(config.executor)
    for name, pool in config.pools.items():
        _check_pool(config, name, pool)
        _check_defaults(name, pool)
    _check_cas(config.cas)
    _check_tenants(config.tenants)
    for key in ("embedded_check_seconds", "embedded_restart_max_seconds"):
        if not getattr(config.database, key) > 0:
            raise Invalid(f"database.{key} must be positive")
    proxy = config.network.proxy
    if proxy.verify_jwt and not (proxy.jwks_url and proxy.issuer and proxy.audience):
        raise Invalid("network.proxy.verify_jwt needs jwks_url, issuer and audience")
    for i, rule in enumerate(config.network.proxy.rules):
        if rule.caller != "worker" and rule.role is None:
            raise Invalid(f"network.proxy.rules[{i}]: a {rule.caller} rule needs a role")
        if not rule.when:
            raise Invalid(f"network.proxy.rules[{i}].when must name at least one claim")
        if rule.names and rule.caller != "worker":
            raise Invalid(f"network.proxy.rules[{i}].names: only a worker rule names workers")


def _check_pool(config: Config, name: str, pool: Pool) -> None:
    if not pool.slots or any(n < 0 for n in pool.slots.values()):
        raise Invalid(f"pools.{name}.slots must name at least one kind with slots >= 0")
    if pool.builtin is not None and name != "serve":
        raise Invalid(f"pools.{name}.builtin: only pools.serve has a built-in worker")
    if pool.provisioner is not None:
        _check_provisioner(config, name, pool.provisioner)
    if not 0 < pool.approval_timeout_seconds <= MAX_APPROVAL_SECONDS:
        raise Invalid(
            f"pools.{name}.approval_timeout_seconds must be positive and at most "
            f"{MAX_APPROVAL_SECONDS:g} (366 days)"
        )


# Which compute keys each provider reads; any other key set for it would do nothing.
COMPUTE_KEYS = {
    "process": {"env", "command"},
    "kubernetes": {
        "image",
        "namespace",
        "api_url",
        "cpu",
        "memory",
        "gpus",
        "node_selector",
        "tolerations",
        "service_account",
        "env",
    },
    "modal": {"image", "app", "gpu", "cpu", "memory", "region", "env"},
}


def _check_executor(e: Executor) -> None:
    """Durations that must fit together (SPEC section 5), each named when it does not."""
    for key in (
        "heartbeat_seconds",
        "unreachable_seconds",
        "evict_seconds",
        "loop_seconds",
        "credential_rotate_hours",
        "output_tail_kb",
        "pack_seconds",
        "dispatch_fallback_seconds",
        "forget_lost_after_seconds",
    ):
        if not getattr(e, key) > 0:  # NaN fails too
            raise Invalid(f"executor.{key} must be positive")
    if e.unreachable_seconds + e.evict_seconds <= 3 * e.heartbeat_seconds:
        raise Invalid(
            "executor: unreachable_seconds + evict_seconds must exceed three heartbeats, "
            "so a silent worker stops its jobs before its leases expire"
        )
    if e.pack_seconds > 30:
        raise Invalid(
            "executor.pack_seconds must be at most 30: a job's output reaches the "
            "artifact store within 30 s (SPEC section 4)"
        )
    if not _finite(e.relay_max_save_gb, low=0):
        raise Invalid(
            "executor.relay_max_save_gb must be a finite number >= 0 (0: a job saves nothing "
            f"through its relay; at most {bounds.MAX_GB:.0f})"
        )
    if not 1 <= e.relay_max_in_flight <= 10000:
        raise Invalid("executor.relay_max_in_flight must be a whole number from 1 to 10000")
    if not 1 <= e.loop_max_failures <= 1000:
        raise Invalid("executor.loop_max_failures must be a whole number from 1 to 1000")
    if not 0 <= e.kill_grace_seconds < 2 * e.heartbeat_seconds:
        # A worker that hears no ack stops its jobs two heartbeats before its leases can expire;
        # TERM, the grace, then KILL must fit inside those two heartbeats.
        raise Invalid(
            "executor.kill_grace_seconds must be shorter than two heartbeats "
            f"(2 * heartbeat_seconds = {2 * e.heartbeat_seconds:g}), so a silent worker's jobs "
            "are dead before their leases expire"
        )


def _check_defaults(name: str, pool: Pool) -> None:
    """A pool's default request: cpus and gpus >= 0, memory a size."""
    try:
        resources.check_cpus(pool.default_cpus, what=f"pools.{name}.default_cpus")
        resources.check_gpus(pool.default_gpus, what=f"pools.{name}.default_gpus")
        resources.parse_size(pool.default_memory)
    except resources.BadSize as exc:
        raise Invalid(f"pools.{name}.default_*: {exc}") from None


def _check_tenants(tenants: Mapping[str, Tenant]) -> None:
    """Tenant names as tokens take them; bounds finite and >= 0 (SPEC section 3)."""
    for name, t in tenants.items():
        if not bounds.TENANT.match(name):
            raise Invalid(
                f"tenants.{name[:130]}: a tenant is 1-128 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        if t.max_queued is not msgspec.UNSET and not 0 <= t.max_queued <= bounds.MAX_WHOLE:
            raise Invalid(
                f"tenants.{name}.max_queued must be a whole number >= 0 (at most "
                f"{bounds.MAX_WHOLE})"
            )
        for field in ("max_running", "max_gpus"):
            n = getattr(t, field)
            if n is not msgspec.UNSET and not 0 <= n <= bounds.MAX_WHOLE:
                raise Invalid(
                    f"tenants.{name}.{field} must be a whole number >= 0 (0: no quota; at most "
                    f"{bounds.MAX_WHOLE})"
                )
        if t.max_stored_gb is not msgspec.UNSET and not _finite(t.max_stored_gb, low=0):
            raise Invalid(
                f"tenants.{name}.max_stored_gb must be a finite number >= 0 (0: no bound; at most "
                f"{bounds.MAX_GB:.0f})"
            )


def _finite(x: float, *, low: float, above: bool = False) -> bool:
    """`x` is finite, at most MAX_GB, and >= `low` (> `low` with `above`)."""
    return math.isfinite(x) and (x > low if above else x >= low) and x <= bounds.MAX_GB


def _check_provisioner(config: Config, pool: str, prov: Provisioner) -> None:
    """Config that does nothing is an error: every provisioner key must have an effect."""
    where = f"pools.{pool}.provisioner"
    if prov.max < 0:
        raise Invalid(f"{where}.max must be >= 0")
    for key in ("idle_seconds", "orphan_exit_seconds"):
        if getattr(prov, key) <= 0:
            raise Invalid(f"{where}.{key} must be positive")
    compute = prov.compute
    given = {f for f in compute.__struct_fields__ if getattr(compute, f) is not msgspec.UNSET} - {
        "provider"
    }
    for key in sorted(given - COMPUTE_KEYS[compute.provider]):
        raise Invalid(f"{where}.compute.{key} has no effect with provider {compute.provider!r}")
    if compute.provider != "process":
        if compute.image is msgspec.UNSET:
            raise Invalid(f"{where}.compute.image: the {compute.provider} provider needs an image")
        if not config.network.url:
            raise Invalid(
                f"{where}: workers on {compute.provider} cannot dial 127.0.0.1; set network.url "
                "to the address they reach this server at"
            )
    if config.network.auth == "token" and prov.credential_secret:
        raise Invalid(
            f'{where}.credential_secret has no effect with auth = "token": provisioned '
            "workers join with a one-time token each"
        )
    if config.network.auth == "proxy" and not prov.credential_secret:
        raise Invalid(
            f"{where}.credential_secret: behind a proxy, provisioned workers need the shared "
            "credential; name the secret that holds it"
        )


# Which [cas] keys each provider reads (besides COMMON_CAS_KEYS, read with every provider).
CAS_KEYS = {
    "local": {"root"},
    "http": {"url"},
    "cached": {"url", "root", "local_max_gb"},
    "s3": {"bucket", "prefix", "endpoint_url", "region"},
}
COMMON_CAS_KEYS = {"provider", "gc_days", "gc_seconds", "max_blob_gb"}


def _check_cas(cas: Cas) -> None:
    """What the provider needs is there, and every key set has an effect with it."""
    default = Cas()
    given = {f for f in cas.__struct_fields__ if getattr(cas, f) != getattr(default, f)}
    for key in sorted(given - CAS_KEYS[cas.provider] - COMMON_CAS_KEYS):
        raise Invalid(f"cas.{key} has no effect with provider {cas.provider!r}")
    if cas.provider in ("http", "cached") and not cas.url:
        raise Invalid(f"cas.url: provider {cas.provider!r} needs the remote store's URL")
    if cas.provider == "cached" and not cas.local_max_gb > 0:
        raise Invalid('cas.local_max_gb must be above 0 with provider "cached"')
    if cas.provider == "s3" and not cas.bucket:
        raise Invalid('cas.bucket: provider "s3" needs a bucket')
    if not 0 < cas.gc_days <= 36500:  # finite: NaN and inf fail
        raise Invalid("cas.gc_days must be above 0 (and at most 36500)")
    if not 0 < cas.gc_seconds <= 86400:
        raise Invalid("cas.gc_seconds must be above 0 (and at most 86400)")
    if not _finite(cas.max_blob_gb, low=0, above=True):
        raise Invalid(
            f"cas.max_blob_gb must be a finite number above 0 (at most {bounds.MAX_GB:.0f})"
        )


POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+asyncpg")
URL_SHAPE = "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"


def check_database_url(url: str) -> None:
    """A PostgreSQL URL berth can use; Invalid naming the problem (never the password)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError on a port that is not a number)
    except ValueError as exc:
        raise Invalid(
            f"database.url {_shown_url(url)!r} is malformed ({exc}); {URL_SHAPE}"
        ) from None
    if parts.scheme not in POSTGRES_SCHEMES:
        what = f"uses {parts.scheme}://" if "://" in url else "is not a URL"
        raise Invalid(
            f"database.url {_shown_url(url)!r} {what}: berth needs PostgreSQL, {URL_SHAPE}"
        )


def _shown_url(url: str) -> str:
    """The URL with its password, if any, replaced by ***."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url if len(url) <= 80 else url[:77] + "..."
    userinfo, at, host = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.split(':', 1)[0]}:***@{host}"
    return f"{scheme}://{rest}"


def split_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host, port); raise Invalid naming network.listen otherwise."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) >= 65536:
        raise Invalid(f"network.listen: {listen!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge `over` onto `base` (tables merge, everything else replaces)."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged
