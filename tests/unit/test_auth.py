"""Roles and permissions, callers and tenants, and berth's own bearer tokens."""

import base64
import hashlib

import pytest

from service.auth import rules, tokens
from service.auth.callers import Caller, Kind, Role
from service.auth.permissions import GRANTS, Perm, allowed
from service.core.errors import Forbidden

P = Perm
EXPECTED = {
    Role.ADMIN: set(Perm) - {P.WORKER_PROTOCOL},
    Role.OPERATOR: {
        P.FLEET_READ,
        P.FLEET_WRITE,
        P.TOKENS,
        P.SECRETS,
        P.JOBS_READ,
        P.JOBS_EXEC,
        P.METRICS,
    },
    # jobs.exec: the job's pool narrows it further ([pools.P] exec, domain/execs.py)
    Role.MEMBER: {P.JOBS_READ, P.JOBS_WRITE, P.JOBS_EXEC, P.FLEET_READ},
    Role.VIEWER: {P.JOBS_READ, P.FLEET_READ},
    Role.WORKER: {P.WORKER_PROTOCOL},
    Role.METRICS: {P.METRICS},
}


def caller(role: Role, kind: Kind = Kind.HUMAN, name: str = "ada", tenants=("t1",)) -> Caller:
    return Caller(kind=kind, name=name, role=role, tenants=frozenset(tenants))


class TestPermissions:
    def test_every_role_has_a_grant(self):
        """The table names every role and no other."""
        assert set(GRANTS) == set(Role)

    @pytest.mark.parametrize("role", list(Role))
    @pytest.mark.parametrize("perm", list(Perm))
    def test_table(self, role, perm):
        """A role is allowed exactly the permissions of the contract's role table."""
        assert allowed(caller(role), perm) is (perm in EXPECTED[role])

    def test_admin_has_all_but_worker_protocol(self):
        """admin may do everything except speak the worker protocol."""
        admin = caller(Role.ADMIN)
        assert all(allowed(admin, perm) for perm in Perm if perm is not P.WORKER_PROTOCOL)
        assert not allowed(admin, P.WORKER_PROTOCOL)

    def test_worker_only_worker_protocol(self):
        """worker may speak the worker protocol and nothing else."""
        assert {perm for perm in Perm if allowed(caller(Role.WORKER), perm)} == {P.WORKER_PROTOCOL}

    @pytest.mark.parametrize("perm", [P.JOBS_WRITE, P.FLEET_WRITE, P.TOKENS, P.SECRETS, P.AUDIT])
    def test_viewer_read_only(self, perm):
        """viewer may not write anything."""
        assert not allowed(caller(Role.VIEWER), perm)

    @pytest.mark.parametrize("role", [Role.MEMBER, Role.VIEWER, Role.WORKER])
    @pytest.mark.parametrize("perm", [P.FLEET_WRITE, P.TOKENS, P.SECRETS, P.AUDIT])
    def test_only_admin_and_operator_manage(self, role, perm):
        """Fleet writes, tokens and secrets are for operators and admins only; audit for admins."""
        assert not allowed(caller(role), perm)

    def test_kind_does_not_change_grants(self):
        """Permissions follow the role, whatever the caller's kind."""
        for kind in Kind:
            assert allowed(caller(Role.MEMBER, kind=kind), P.JOBS_WRITE)
            assert not allowed(caller(Role.MEMBER, kind=kind), P.TOKENS)


class TestCaller:
    @pytest.mark.parametrize(
        ("kind", "name", "signed"),
        [
            (Kind.HUMAN, "ada", "human:ada"),
            (Kind.SERVICE, "ci-pipeline", "service:ci-pipeline"),
            (Kind.WORKER, "gpu-3", "worker:gpu-3"),
        ],
    )
    def test_signature(self, kind, name, signed):
        """A caller is signed `kind:name`."""
        assert str(caller(Role.MEMBER, kind=kind, name=name)) == signed

    @pytest.mark.parametrize("role", list(Role))
    def test_tenant_filter(self, role):
        """Only admin gets no tenant filter; everyone else is limited to their own tenants."""
        c = caller(role, tenants=("t1", "t2"))
        if role is Role.ADMIN:
            assert c.tenant_filter() is None
        else:
            assert c.tenant_filter() == frozenset({"t1", "t2"})

    def test_no_tenants_filters_everything(self):
        """A non-admin with no tenants filters to the empty set, never to None."""
        assert caller(Role.VIEWER, tenants=()).tenant_filter() == frozenset()

    @pytest.mark.parametrize(
        ("role", "tenant", "sees"),
        [
            (Role.ADMIN, "other", True),
            (Role.MEMBER, "t1", True),
            (Role.MEMBER, "other", False),
            (Role.VIEWER, "other", False),
            (Role.OPERATOR, "other", False),
        ],
    )
    def test_sees(self, role, tenant, sees):
        """A caller sees its own tenants; admin sees every tenant."""
        assert caller(role).sees(tenant) is sees


class TestTokens:
    def test_prefix(self):
        """A minted token starts with `brt_`."""
        assert tokens.mint().startswith("brt_")

    def test_at_least_256_bits(self):
        """The part after the prefix is url-safe base64 of at least 32 random bytes."""
        body = tokens.mint().removeprefix(tokens.PREFIX)
        assert len(body) * 6 >= 256
        assert len(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))) >= 32

    def test_unique(self):
        """1000 mints give 1000 different tokens."""
        assert len({tokens.mint() for _ in range(1000)}) == 1000

    def test_digest(self):
        """The stored digest is a deterministic 32-byte sha256 that differs between tokens."""
        a, b = tokens.mint(), tokens.mint()
        assert len(tokens.digest(a)) == 32
        assert isinstance(tokens.digest(a), bytes)
        assert tokens.digest(a) == tokens.digest(a)
        assert tokens.digest(a) != tokens.digest(b)
        assert tokens.digest("brt_x") == hashlib.sha256(b"brt_x").digest()

    @pytest.mark.parametrize(
        ("token", "looks"),
        [
            ("brt_" + "a" * 21, True),
            ("brt_" + "a" * 20, False),
            ("brt_", False),
            ("xyz_" + "a" * 43, False),
            ("BRT_" + "a" * 43, False),
            ("", False),
        ],
    )
    def test_looks_like(self, token, looks):
        """looks_like wants the prefix and more than 20 characters after it."""
        assert tokens.looks_like(token) is looks

    def test_minted_looks_like(self):
        """A freshly minted token looks like a token."""
        assert tokens.looks_like(tokens.mint())


class TestWorkerNames:
    """A worker name belongs to one worker rule (SPEC section 6); a principal names itself only
    as its rule allows."""

    RULES = (
        rules.Rule(when={"groups": "admins"}, kind=Kind.HUMAN, role=Role.ADMIN),
        rules.Rule(when={"principal": "box-a"}, kind=Kind.WORKER, tenants=frozenset({"a"})),
        rules.Rule(
            when={"principal": "lab-b"},
            kind=Kind.WORKER,
            tenants=frozenset({"b"}),
            names="lab-b-*",
        ),
        rules.Rule(when={"principal": "berth-workers"}, kind=Kind.WORKER),
    )

    @pytest.mark.parametrize(
        ("principal", "name", "admitted"),
        [
            ("berth-workers", "gpu-7", True),  # the fleet rule owns what nobody else claims
            ("berth-workers", "box-a", False),  # the tenant rule's principal's own name
            ("berth-workers", "lab-b-1", False),  # the glob of lab-b's rule
            ("box-a", "box-a", True),
            ("box-a", "gpu-7", False),  # a tenant's machine posing as a fleet worker
            ("box-a", "box-a-2", False),  # without names: only its principal's own name
            ("lab-b", "lab-b-1", True),
            ("lab-b", "lab-b", False),
            ("lab-b", "gpu-7", False),
        ],
    )
    def test_table(self, principal, name, admitted):
        claims = rules.Claims.from_headers({"principal": principal})

        def resolve():
            return rules.resolve(
                claims, self.RULES, name_claims=["user", "principal"], worker_name=name
            )

        if admitted:
            caller = resolve()
            assert caller.kind is Kind.WORKER and caller.name == name
            assert caller.identity.startswith("proxy:")
        else:
            with pytest.raises(Forbidden):
                resolve()

    def test_each_rule_is_its_own_identity(self):
        """Two rules never share an identity; the same rule always gives the same one."""
        identities = {r.identity for r in self.RULES}
        assert len(identities) == len(self.RULES)
        again = rules.Rule(when={"principal": "berth-workers"}, kind=Kind.WORKER)
        assert again.identity == self.RULES[-1].identity


class TestTenantRulesNeverWiden:
    @pytest.mark.parametrize("kind", [Kind.HUMAN, Kind.WORKER])
    def test_a_tenant_rule_yielding_no_tenant_refuses(self, kind):
        """A rule taking tenants from a claim that holds none refuses, rather than granting
        every tenant (an empty set is fleet-wide for an operator or a worker)."""
        rule = rules.Rule(
            when={"groups": "*"},
            kind=kind,
            role=None if kind is Kind.WORKER else Role.OPERATOR,
            tenants_from="groups",
            tenant_prefix="team-",
            names="eve*" if kind is Kind.WORKER else "",
        )
        claims = rules.Claims.from_headers({"groups": "staff", "user": "eve"})
        with pytest.raises(Forbidden, match="none from these claims"):
            rules.resolve(claims, [rule], name_claims=["user"], worker_name="eve")
        granted = rules.Claims.from_headers({"groups": "staff,team-ml", "user": "eve"})
        caller = rules.resolve(granted, [rule], name_claims=["user"], worker_name="eve")
        assert caller.tenants == frozenset({"ml"})
