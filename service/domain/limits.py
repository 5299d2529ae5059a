"""Limits: operator overrides of berth.toml keys (`berth limits`), and the config they make.

`put` and `remove` audit the change (`limit.set` / `limit.unset`) and NOTIFY berth_limits_v1
in the transaction that makes it, so every server re-reads the table once it commits
(api/limits_watch.py); `in_force` is that read. The provisioning loop and anything else that
runs per pass call `effective_config(db, config)` and use what it returns for that pass.

Who may change which key (SPEC section 8): what every tenant shares (`pools.*`, and
`tenants.default.*`, the bounds of every tenant without its own) needs a fleet-wide caller (an
admin, or an operator of no tenants); an operator of some tenants changes only
`tenants.T.*` of its own tenants. Who sees which: a caller that is not fleet-wide sees the pool
keys, `tenants.default.*` and its own tenants' keys, never another tenant's name.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.auth.callers import Caller
from service.config import Config
from service.core import limits as core_limits
from service.core.bounds import DEFAULT as DEFAULT_TENANTS
from service.core.errors import Forbidden, Invalid, NotFound
from service.core.placement import PoolSpec
from service.db.engine import Database
from service.db.queries import limits as limits_q
from service.db.queries.limits import LimitRecord
from service.domain import audit

MAX_REASON = 1000


@dataclass(frozen=True, slots=True)
class InForce:
    """berth.toml (`base`), the limits set, and `config`: the base with the limits that fit it."""

    base: Config
    config: Config
    records: tuple[LimitRecord, ...] = ()

    @classmethod
    def of(cls, base: Config, records: Sequence[LimitRecord] = ()) -> "InForce":
        return cls(base, core_limits.effective(base, values(records)), tuple(records))

    def pools(self) -> dict[str, PoolSpec]:
        """What placement uses: every pool, the built-in one included, limits applied."""
        return self.config.pool_specs()

    def shown(self, *, pool: str | None = None, to: Caller | None = None) -> list[dict[str, Any]]:
        """The limits as people see them: all, or those in force on one pool.

        With `to`, only those that caller may see (`visible`).
        """
        return [
            describe(self.base, r)
            for r in self.records
            if (pool is None or _pool_of(self.base, r.key) == pool)
            and (to is None or visible(to, r.key))
        ]


def visible(caller: Caller, key: str) -> bool:
    """Whether `caller` may see the limit `key`: a tenant's key only by a caller of that tenant."""
    tenant = core_limits.tenant_of(key)
    # Another tenant's key names that tenant: only a fleet-wide caller sees every tenant's.
    return (
        caller.fleet_wide or tenant is None or tenant == DEFAULT_TENANTS or tenant in caller.tenants
    )


def check_may_change(caller: Caller, key: str) -> None:
    """Forbidden, saying why, unless `caller` may set or unset `key` (SPEC section 8)."""
    if caller.fleet_wide:
        return
    tenant = core_limits.tenant_of(key)
    # Security: a tenant-scoped operator changes only what touches its tenants alone; a pool or
    # [tenants.default] is every tenant's.
    if tenant is None:
        raise Forbidden(
            f"{key[:200]}: pool-wide limits need an admin or a fleet-wide operator (one of no "
            "tenants); you may set tenants.T.* of your own tenants"
        )
    if tenant == DEFAULT_TENANTS:
        raise Forbidden(
            f"{key[:200]}: tenants.default.* is the bound of every tenant: it needs an admin or "
            "a fleet-wide operator; set tenants.T.* of your own tenants instead"
        )
    if tenant not in caller.tenants:
        raise Forbidden(f"{key[:200]}: you do not hold tenant {tenant[:130]!r}")


def _pool_of(base: Config, key: str) -> str | None:
    try:
        return core_limits.target(base, key).pool
    except Invalid:
        return None


def values(records: Sequence[LimitRecord]) -> dict[str, Any]:
    return {r.key: r.value for r in records}


def describe(base: Config, record: LimitRecord) -> dict[str, Any]:
    """One limit as people see it.

    Its value, berth.toml's (`default`: null when berth.toml has none), who, when and why, and
    whether it applies (false: the key no longer fits berth.toml, and why not).
    """
    unfit = core_limits.unfit(base, {record.key: record.value})
    return {
        "key": record.key,
        "value": record.value,
        "default": core_limits.default(base, record.key),
        "reason": record.reason,
        "set_by": record.set_by,
        "set_at": record.set_at.isoformat(),
        "in_force": not unfit,
        **({"not_in_force_because": unfit[record.key]} if unfit else {}),
    }


def check_reason(reason: str) -> str:
    reason = reason.strip()
    if not reason:
        raise Invalid("a limit needs a reason (--reason): say why, for whoever reads it next")
    if len(reason) > MAX_REASON or "\x00" in reason:
        raise Invalid(f"the reason must be at most {MAX_REASON} characters, without NUL")
    return reason


async def put(
    db: Database,
    config: Config,
    caller: Caller,
    *,
    key: str,
    value: object,
    reason: str,
    request_id: str = "",
) -> LimitRecord:
    """Set `key` to `value` (a string or JSON number), checked against berth.toml (`config`)."""
    check_may_change(caller, key)
    parsed = core_limits.parse(config, key, value)
    reason = check_reason(reason)
    async with db.begin() as conn:
        record, previous = await limits_q.put(
            conn, key=key, value=parsed, reason=reason, by=str(caller)
        )
        await limits_q.notify(conn, key)
        await audit.record(
            conn,
            caller,
            "limit.set",
            key,
            request_id=request_id,
            value=parsed,
            reason=reason,
            previous=previous.value if previous is not None else None,
        )
    return record


async def remove(db: Database, caller: Caller, *, key: str, request_id: str = "") -> LimitRecord:
    """Unset `key`: berth.toml's value is in force again from the next pass."""
    check_may_change(caller, key)
    async with db.begin() as conn:
        removed = await limits_q.remove(conn, key=key)
        if removed is None:
            raise NotFound(f"no limit {key!r} is set")
        await limits_q.notify(conn, key)
        await audit.record(
            conn, caller, "limit.unset", key, request_id=request_id, previous=removed.value
        )
    return removed


async def list_all(db: Database) -> list[LimitRecord]:
    async with db.begin() as conn:
        return await limits_q.list_all(conn)


async def in_force(db: Database, config: Config) -> InForce:
    """berth.toml and the limits as the table holds them now."""
    return InForce.of(config, await list_all(db))


async def effective_config(db: Database, config: Config) -> Config:
    """berth.toml (`config`) with the limits set now: what a pass should use."""
    return (await in_force(db, config)).config
