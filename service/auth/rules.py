"""Proxy claims -> Caller. The first rule whose `when` matches wins; no match is refused.

Pure: no I/O. `api.identity` builds Claims from the headers named in config, and only those.
Headers the proxy did not stamp must never reach here: the proxy strips client copies.
"""

import fnmatch
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from service.auth.callers import Caller, Kind, Role
from service.core.errors import Forbidden


@dataclass(frozen=True, slots=True)
class Claims:
    values: Mapping[str, tuple[str, ...]]  # a multi-valued claim (groups) holds several

    @classmethod
    def from_headers(cls, raw: Mapping[str, str]) -> "Claims":
        """Comma-separated header values become several values of one claim."""
        return cls(
            {
                name: tuple(v.strip() for v in value.split(",") if v.strip())
                for name, value in raw.items()
            }
        )

    def matches(self, name: str, pattern: str) -> bool:
        """Any value of the claim equals the pattern, or fits it as a shell glob."""
        return any(fnmatch.fnmatchcase(v, pattern) for v in self.values.get(name, ()))

    def first_present(self, names: Sequence[str]) -> str | None:
        return next((v for n in names for v in self.values.get(n, ()) if v), None)


@dataclass(frozen=True, slots=True)
class Rule:
    when: Mapping[str, str]
    kind: Kind = Kind.HUMAN
    role: Role | None = None  # worker rules may omit it; config loading rejects others without
    tenants: frozenset[str] = frozenset()
    tenants_from: str = ""  # a claim whose values name tenants, e.g. groups ...
    tenant_prefix: str = ""  # ... those starting with this prefix, the prefix removed
    names: str = ""  # worker rules: the worker names its principals may use (a glob)

    @property
    def scoped(self) -> bool:
        """A tenant's rule (its workers serve only some tenants), not a fleet-wide one."""
        return bool(self.tenants or self.tenants_from)

    @property
    def identity(self) -> str:
        """What a worker this rule admits is known by (its rows and leases belong to it)."""
        body = {
            "when": dict(sorted(self.when.items())),
            "tenants": sorted(self.tenants),
            "tenants_from": self.tenants_from,
            "tenant_prefix": self.tenant_prefix,
            "names": self.names,
        }
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        return f"proxy:{digest[:24]}"

    def matches(self, claims: Claims) -> bool:
        return all(claims.matches(name, value) for name, value in self.when.items())

    def tenants_of(self, claims: Claims) -> frozenset[str]:
        found = set(self.tenants)
        if self.tenants_from:
            for value in claims.values.get(self.tenants_from, ()):
                if value.startswith(self.tenant_prefix) and len(value) > len(self.tenant_prefix):
                    found.add(value[len(self.tenant_prefix) :])
        return frozenset(found)


def owner(name: str, rules: Sequence[Rule], name_claims: Sequence[str]) -> Rule | None:
    """The worker rule a worker name belongs to (SPEC section 6), or None.

    The first worker rule whose `names` glob matches it; else a tenant's rule without `names`
    whose own principals may bear it (its `when` on a name claim matches it); else the first
    fleet-wide rule without `names`, which owns every name no other worker rule claims.
    """
    workers = [r for r in rules if r.kind is Kind.WORKER]
    for rule in workers:
        if rule.names and fnmatch.fnmatchcase(name, rule.names):
            return rule
    for rule in workers:
        if not rule.names and rule.scoped:
            patterns = [rule.when[c] for c in name_claims if c in rule.when]
            if any(fnmatch.fnmatchcase(name, p) for p in patterns):
                return rule
    return next((r for r in workers if not r.names and not r.scoped), None)


def resolve(
    claims: Claims,
    rules: Sequence[Rule],
    *,
    name_claims: Sequence[str],
    worker_name: str | None,
) -> Caller:
    """The caller named by the first matching rule; Forbidden otherwise (reason for the log)."""
    rule = next((r for r in rules if r.matches(claims)), None)
    if rule is None:
        raise Forbidden("no rule matches")
    if rule.kind is Kind.WORKER:
        # Only a worker rule honours the worker header: anyone else naming themselves a worker
        # gains nothing from it.
        name = worker_name
        if not name:
            raise Forbidden("a worker rule matched but the request names no worker")
        # Security: a worker's name is not its identity. A principal may name itself only as
        # its rule allows, so a tenant's machine cannot pose as a fleet worker (and take over
        # the leases of another tenant's jobs), nor one fleet rule's workers as another's.
        if owner(name, rules, name_claims) is not rule:
            raise Forbidden(f"worker name {name!r} belongs to another worker rule")
        if not rule.names and rule.scoped and name != claims.first_present(name_claims):
            raise Forbidden(
                f"worker name {name!r}: a tenant's worker rule without names admits only its "
                "principal's own name"
            )
        # A worker rule with tenants admits a tenant's own machines: they serve only those.
        return Caller(
            Kind.WORKER, name, Role.WORKER, _tenants(rule, claims), identity=rule.identity
        )
    name = claims.first_present(name_claims)
    if not name:
        raise Forbidden(f"a {rule.kind} rule matched but no claim names the caller")
    if rule.role is None:  # unreachable with a validated config; a bad table refuses, not grants
        raise Forbidden("the matching rule grants no role")
    return Caller(rule.kind, name, rule.role, _tenants(rule, claims))


def _tenants(rule: Rule, claims: Claims) -> frozenset[str]:
    """The tenants a matched rule grants; Forbidden when a tenant's rule grants none.

    Security: no tenants means every tenant (a fleet-wide operator or worker), so a rule that
    names tenants, or takes them from a claim, and yields none must refuse, never widen.
    """
    tenants = rule.tenants_of(claims)
    if rule.scoped and not tenants:
        raise Forbidden("the matching rule grants tenants, but none from these claims")
    return tenants
