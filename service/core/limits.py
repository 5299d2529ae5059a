"""Operator limits: which config keys `berth limits set` may override, and the config they make.

Pure. A limit is a key (`pools.gpu.slots.agent`, `tenants.ml.max_queued`) and a value; `parse`
checks a key against the config and turns a value (a string from the CLI, JSON from the API,
JSON from the table) into its type, or raises Invalid naming the key. `effective(config,
overrides)` returns a new frozen config with the overrides applied; `config.pool_specs()` on it
is what placement uses, `config.tenant_bounds(T)` what submits and uploads check.

Core sits below `service.config` in the layers, so this module knows the config by its shape
(the Protocols below), not by its classes; `service.config.Config` fits them.

Pitfalls:
- An override whose key no longer fits the config (its pool left berth.toml, or lost its
  provisioner) is skipped by `effective`, never fatal: a server must start whatever the table
  holds. `unfit` says which and why, for the log.
- The built-in pool `serve` exists without a `[pools.serve]` table; an override of it makes one
  with berth.toml's defaults (as `Config.pool_specs` does). Likewise a tenant without a
  `[tenants.T]` table: an override makes one, its other keys still taking [tenants.default]'s.
- Tenant keys fit any config: a bound may be set for a tenant before its first job.
"""

import contextlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

import msgspec

from service.core import bounds
from service.core.bounds import TenantShape
from service.core.errors import Invalid

MAX_KEY = 200  # the limits.key column
MAX_WHOLE = 2**31 - 1
MAX_NUMBER = 1e9
BUILTIN_POOL = "serve"
KIND = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")  # as a job's kind (api/body.py)
_WHOLE = re.compile(r"\A\s*[+-]?[0-9]+\s*\Z")

KEYS = (
    "pools.P.slots.KIND",
    "pools.P.max_load",
    "pools.P.min_memory_gb",
    "pools.P.min_disk_gb",
    "pools.P.provisioner.max",
    "pools.P.provisioner.idle_seconds",
    "tenants.T.max_queued",
    "tenants.T.max_stored_gb",
    "tenants.T.max_running",
    "tenants.T.max_gpus",
)
TENANT_FIELDS = tuple(bounds.FIELDS)

Value = int | float


class ProvisionerShape(Protocol):
    @property
    def max(self) -> int: ...
    @property
    def idle_seconds(self) -> float: ...


class PoolShape(Protocol):
    @property
    def slots(self) -> Mapping[str, int]: ...
    @property
    def max_load(self) -> float: ...
    @property
    def min_memory_gb(self) -> float: ...
    @property
    def min_disk_gb(self) -> float: ...
    @property
    def provisioner(self) -> ProvisionerShape | None: ...


class ConfigShape(Protocol):
    @property
    def pools(self) -> Mapping[str, PoolShape]: ...
    @property
    def tenants(self) -> Mapping[str, TenantShape]: ...


C = TypeVar("C", bound=ConfigShape)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Target:
    """What a key names.

    A field of a pool, a slot kind of a pool, a provisioner field, or a tenant's bound
    (`tenant` set, `pool` "").
    """

    pool: str
    field: str  # slots | max_load | min_memory_gb | min_disk_gb | provisioner.max | …idle_seconds
    kind: str = ""  # field == "slots": the job kind
    tenant: str = ""  # a tenant bound: the tenant ("default": every tenant without its own)


_POOL_FIELDS = ("max_load", "min_memory_gb", "min_disk_gb")
_PROVISIONER_FIELDS = ("provisioner.max", "provisioner.idle_seconds")


def target(config: ConfigShape, key: str) -> Target:
    """What `key` overrides in `config`; Invalid naming the key when it is none of KEYS."""
    if len(key) > MAX_KEY:
        raise Invalid(f"limit key too long ({len(key)} characters; at most {MAX_KEY})")
    if key.startswith("tenants."):
        return _tenant_target(key)
    if not key.startswith("pools."):
        raise _unknown(key)
    names = sorted({*config.pools, BUILTIN_POOL}, key=len, reverse=True)
    found = next((n for n in names if key.startswith(f"pools.{n}.")), None)
    if found is None:  # name the pool the key meant, when the rest of it is a pool key
        pool, _, rest = key.removeprefix("pools.").partition(".")
        _field(key, rest)
        known = ", ".join(sorted({*config.pools, BUILTIN_POOL}))
        raise Invalid(f"{key}: no pool {pool!r} in berth.toml (pools: {known})")
    field, kind = _field(key, key.removeprefix(f"pools.{found}."))
    if field in _PROVISIONER_FIELDS and _pool(config, found).provisioner is None:
        raise Invalid(
            f"{key}: pool {found!r} has no provisioner (no [pools.{found}.provisioner] in "
            "berth.toml)"
        )
    return Target(pool=found, field=field, kind=kind)


def _tenant_target(key: str) -> Target:
    tenant, _, field = key.removeprefix("tenants.").rpartition(".")
    if field not in TENANT_FIELDS:
        raise _unknown(key)
    if not bounds.TENANT.match(tenant):
        raise Invalid(
            f"{key}: a tenant is 1-128 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit"
        )
    return Target(pool="", field=field, tenant=tenant)


def tenant_of(key: str) -> str | None:
    """The tenant a tenant key names (`tenants.T.max_queued` -> T); None for any other key."""
    if not key.startswith("tenants."):
        return None
    return key.removeprefix("tenants.").rpartition(".")[0] or None


def _field(key: str, rest: str) -> tuple[str, str]:
    if rest in _POOL_FIELDS or rest in _PROVISIONER_FIELDS:
        return rest, ""
    if rest.startswith("slots."):
        kind = rest.removeprefix("slots.")
        if not KIND.match(kind):
            raise Invalid(
                f"{key}: a job kind is letters, digits, '.', '_' and '-', starting with a "
                "letter or digit, at most 64 characters"
            )
        return "slots", kind
    raise _unknown(key)


def _unknown(key: str) -> Invalid:
    return Invalid(f"unknown limit key {key!r}; limits are {', '.join(KEYS)}")


def parse(config: ConfigShape, key: str, raw: object) -> Value:
    """The value `raw` means for `key` (an int or a float), or Invalid naming key and rule."""
    return _parsed(config, key, raw)[1]


def _parsed(config: ConfigShape, key: str, raw: object) -> tuple[Target, Value]:
    t = target(config, key)
    if t.field in ("slots", "provisioner.max", *bounds.WHOLE_FIELDS):
        return t, _whole(key, raw)
    return t, _number(key, raw, positive=t.field == "provisioner.idle_seconds")


def _shown(raw: object) -> str:
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


def _whole(key: str, raw: object) -> int:
    n: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        n = raw
    elif isinstance(raw, str) and _WHOLE.match(raw):
        n = int(raw)
    if n is None or not 0 <= n <= MAX_WHOLE:
        raise Invalid(f"{key} must be a whole number >= 0 (at most {MAX_WHOLE}); got {_shown(raw)}")
    return n


def _number(key: str, raw: object, *, positive: bool) -> float:
    x = math.nan
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        x = float(raw) if abs(raw) <= MAX_NUMBER else math.inf
    elif isinstance(raw, str) and len(raw) <= 64:
        with contextlib.suppress(ValueError):
            x = float(raw)
    low = x > 0 if positive else x >= 0
    if not (math.isfinite(x) and low and x <= MAX_NUMBER):
        rule = "> 0" if positive else ">= 0"
        raise Invalid(
            f"{key} must be a finite number {rule} (at most {MAX_NUMBER:.0f}); got {_shown(raw)}"
        )
    return x


def default(config: ConfigShape, key: str) -> Value | None:
    """What `config` (berth.toml) says for `key`; None when it says nothing or the key is unfit."""
    try:
        t = target(config, key)
    except Invalid:
        return None
    if t.tenant:
        return bounds.value(bounds.of(config, t.tenant), t.field)
    pool = _pool(config, t.pool)
    values: dict[str, Value | None] = {
        "slots": pool.slots.get(t.kind),
        "max_load": pool.max_load,
        "min_memory_gb": pool.min_memory_gb,
        "min_disk_gb": pool.min_disk_gb,
    }
    if pool.provisioner is not None:
        values["provisioner.max"] = pool.provisioner.max
        values["provisioner.idle_seconds"] = pool.provisioner.idle_seconds
    return values[t.field]


def unfit(config: ConfigShape, overrides: Mapping[str, object]) -> dict[str, str]:
    """The overrides `effective` skips, each with why (its pool left berth.toml, say)."""
    out = {}
    for key, raw in overrides.items():
        try:
            parse(config, key, raw)
        except Invalid as exc:
            out[key] = exc.message
    return out


def effective(config: C, overrides: Mapping[str, object]) -> C:
    """`config` with every override that fits it applied; the others are skipped."""
    changes: dict[str, dict[str, Value]] = {}  # pool -> field -> value
    slots: dict[str, dict[str, int]] = {}  # pool -> kind -> slots
    provisioner: dict[str, dict[str, Value]] = {}  # pool -> field -> value
    tenants: dict[str, dict[str, Value]] = {}  # tenant -> field -> value
    for key, raw in sorted(overrides.items()):
        try:
            t, value = _parsed(config, key, raw)
        except Invalid:
            continue
        if t.tenant:
            tenants.setdefault(t.tenant, {})[t.field] = value
        elif t.field == "slots":
            assert isinstance(value, int)
            slots.setdefault(t.pool, {})[t.kind] = value
        elif t.field in _PROVISIONER_FIELDS:
            provisioner.setdefault(t.pool, {})[t.field.removeprefix("provisioner.")] = value
        else:
            changes.setdefault(t.pool, {})[t.field] = value
    touched = {*changes, *slots, *provisioner}
    if tenants:
        config = _replace(
            config,
            tenants={
                **config.tenants,
                **{
                    name: _replace(_tenant(config, name), **fields)
                    for name, fields in tenants.items()
                },
            },
        )
    if not touched:
        return config
    pools: dict[str, PoolShape] = dict(config.pools)
    for name in sorted(touched):
        pool = _pool(config, name)
        fields: dict[str, object] = dict(changes.get(name, {}))
        if name in slots:
            fields["slots"] = {**pool.slots, **slots[name]}
        if name in provisioner:
            assert pool.provisioner is not None  # parse() checked it
            fields["provisioner"] = _replace(pool.provisioner, **provisioner[name])
        pools[name] = _replace(pool, **fields)
    return _replace(config, pools=pools)


def _pool(config: ConfigShape, name: str) -> PoolShape:
    """The pool `name` of the config; the built-in pool with berth.toml's defaults if absent."""
    if name in config.pools:
        return config.pools[name]
    assert name == BUILTIN_POOL, name
    # The same defaults `[pools.serve]` with nothing in it would give.
    return msgspec.convert({"pools": {BUILTIN_POOL: {}}}, type(config)).pools[BUILTIN_POOL]


def _tenant(config: ConfigShape, name: str) -> TenantShape:
    """The tenant's own table; one that sets nothing (all from [tenants.default]) if absent."""
    if name in config.tenants:
        return config.tenants[name]
    return msgspec.convert({"tenants": {name: {}}}, type(config)).tenants[name]


def _replace(struct: T, **changes: object) -> T:
    """msgspec.structs.replace for the config's frozen Structs (known here by shape only)."""
    assert isinstance(struct, msgspec.Struct), type(struct)
    return msgspec.structs.replace(struct, **changes)
