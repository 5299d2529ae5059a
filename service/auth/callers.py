"""Who makes a request: its kind, name, role and tenants. Writes are signed `kind:name`."""

import enum
from dataclasses import dataclass


class Kind(enum.StrEnum):
    HUMAN = "human"
    SERVICE = "service"
    WORKER = "worker"
    JOB = "job"  # a job's call, relayed by its worker while its lease is live
    OPS = "ops"  # a break-glass command on the database, signed with the OS user


class Role(enum.StrEnum):
    ADMIN = "admin"
    OPERATOR = "operator"
    MEMBER = "member"
    VIEWER = "viewer"
    WORKER = "worker"
    METRICS = "metrics"  # reads /metrics only


@dataclass(frozen=True, slots=True)
class Caller:
    kind: Kind
    name: str
    role: Role
    tenants: frozenset[str]
    credential: str = ""  # the berth token it presented (its name), when it presented one
    on_behalf: str = ""  # a job's caller: who created the job (the audit names both)
    # What authenticated it, for a worker: `token:<id>` (the same across a joined credential's
    # rotations) or `proxy:<digest>` (the worker rule that matched). A worker row and its
    # leases belong to one identity (domain/leasing.py attach).
    identity: str = ""

    def __str__(self) -> str:  # how writes are signed, e.g. "service:ci-pipeline"
        return f"{self.kind}:{self.name}"

    @property
    def all_tenants(self) -> bool:
        return self.role is Role.ADMIN

    @property
    def fleet_wide(self) -> bool:
        """An admin, or an operator of no tenants in particular (SPEC section 8).

        It may change what every tenant shares (pool-wide limits, [tenants.default]).
        """
        return self.role is Role.ADMIN or (self.role is Role.OPERATOR and not self.tenants)

    def sees(self, tenant: str) -> bool:
        return self.all_tenants or tenant in self.tenants

    def tenant_filter(self) -> frozenset[str] | None:
        """The tenants a query must be limited to; None means every tenant (admin)."""
        return None if self.all_tenants else self.tenants
