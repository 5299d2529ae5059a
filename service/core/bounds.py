"""The bounds each tenant lives under: `[tenants.default]`, overridden per tenant by `[tenants.T]`.

Pure. berth.toml (and the limits in force, core/limits.py) give each tenant `max_queued` and
`max_stored_gb`; a key a tenant's own table does not set takes `[tenants.default]`'s, and one
that table does not set either takes the built-in default below. Each value comes with the key
that set it, so a refusal names the key an operator would change.

Core sits below `service.config`, so the config is known here by its shape (Protocols).
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import msgspec

DEFAULT = "default"  # [tenants.default]: every tenant's bounds unless its own table says
FIELDS: Mapping[str, int | float] = {
    "max_queued": 100000,
    "max_stored_gb": 0.0,
    "max_running": 0,  # jobs running at once (0: no quota); enforced in the claim
    "max_gpus": 0,  # GPUs its running jobs hold at once (0: no quota)
}
WHOLE_FIELDS = ("max_queued", "max_running", "max_gpus")
RELAY_MAX_SAVE_GB = 10.0  # [executor] relay_max_save_gb's default (also the welcome's)
GB = 1_000_000_000  # bounds count decimal gigabytes, like disk sizes (and [cas] local_max_gb)
MAX_WHOLE = 2**31 - 1
MAX_GB = 1e9
TENANT = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")  # as domain/tokens.NAME


class TenantShape(Protocol):
    @property
    def max_queued(self) -> int | msgspec.UnsetType: ...
    @property
    def max_stored_gb(self) -> float | msgspec.UnsetType: ...
    @property
    def max_running(self) -> int | msgspec.UnsetType: ...
    @property
    def max_gpus(self) -> int | msgspec.UnsetType: ...


class TenantsShape(Protocol):
    @property
    def tenants(self) -> Mapping[str, TenantShape]: ...


@dataclass(frozen=True, slots=True)
class TenantBounds:
    """One tenant's bounds in force, and the key that set each (for refusals)."""

    tenant: str
    max_queued: int
    max_stored_gb: float
    keys: Mapping[str, str]
    max_running: int = 0  # 0: no quota
    max_gpus: int = 0  # field -> "tenants.T.field" or "tenants.default.field"

    @property
    def max_stored_bytes(self) -> int:
        """0: no bound."""
        return gb_bytes(self.max_stored_gb)

    def key(self, field: str) -> str:
        return self.keys[field]


def of(config: TenantsShape, tenant: str) -> TenantBounds:
    """`tenant`'s bounds in `config`: its own table, else [tenants.default], else built in."""
    values: dict[str, int | float] = {}
    keys: dict[str, str] = {}
    for field, builtin in FIELDS.items():
        for table in (tenant, DEFAULT):
            got = getattr(config.tenants[table], field) if table in config.tenants else None
            if got is not None and got is not msgspec.UNSET:
                values[field], keys[field] = got, f"tenants.{table}.{field}"
                break
        else:
            values[field], keys[field] = builtin, f"tenants.{DEFAULT}.{field}"
    return TenantBounds(
        tenant=tenant,
        max_queued=int(values["max_queued"]),
        max_stored_gb=float(values["max_stored_gb"]),
        keys=keys,
        max_running=int(values["max_running"]),
        max_gpus=int(values["max_gpus"]),
    )


def value(found: TenantBounds, field: str) -> int | float:
    """One bound of `found` by its field name."""
    return float(found.max_stored_gb) if field == "max_stored_gb" else int(getattr(found, field))


def stores_bounded(config: TenantsShape) -> bool:
    """Whether any tenant has a max_stored_gb (else nothing need count stored bytes)."""
    return any(
        t.max_stored_gb is not msgspec.UNSET and t.max_stored_gb > 0
        for t in config.tenants.values()
    )


def gb_bytes(gb: float) -> int:
    return int(gb * GB)


def shown_bytes(n: int) -> str:
    """A byte count as people read it in a refusal: "1.5 GB", "512 bytes"."""
    return f"{n / GB:.6g} GB" if n >= GB // 1000 else f"{n} bytes"
