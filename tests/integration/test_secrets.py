"""A secret has an owner (SPEC section 7): one tenant, several, every tenant, or the system.

A system secret (no tenant: the shared worker credential, provider credentials) is named by no
job; refusing a secret a job may not use says exactly what refusing a missing one says.
"""

from service.domain import secrets

VALUE = "s3cr3t-value-4b1d"


async def set_secret(api, name: str, token: str | None = None, **owner) -> int:
    body = {"value": VALUE, **owner}
    r = await api.call("PUT", f"/api/v1/secrets/{name}", token, json=body)
    return r.status_code


async def submit(api, tenant: str, secret: str, token: str | None = None):
    body = {"command": ["true"], "tenant": tenant, "secrets": {"V": secret}}
    return await api.call("POST", "/api/v1/jobs", token, json=body)


class TestOwners:
    async def test_a_system_secret_is_refused_like_a_missing_one(self, api):
        """A tenant's job naming a system secret gets the 404 and words a missing one gets, and its
        value never comes back."""
        assert await set_secret(api, "fleet-credential") == 200
        member = await api.mint("ci", "service", "a")
        for token in (member, None):  # the member itself, or an admin submitting into a
            system = await submit(api, "a", "fleet-credential", token)
            missing = await submit(api, "a", "no-such-secret", token)
            assert system.status_code == missing.status_code == 404, system.text
            words = system.json()["error"].replace("fleet-credential", "X")
            assert words == missing.json()["error"].replace("no-such-secret", "X")
            assert VALUE not in system.text
        jobs = (await api.call("GET", "/api/v1/jobs")).json()
        assert jobs == []  # nothing was created

    async def test_only_an_admin_sees_or_manages_system_secrets(self, api):
        """A tenant's operator sees its own and shared names, not the system's; it may neither
        set a system secret nor share one with every tenant."""
        assert await set_secret(api, "fleet-credential") == 200
        assert await set_secret(api, "shared", all_tenants=True) == 200
        assert await set_secret(api, "b-only", tenants=["b"]) == 200
        operator = await api.mint("op-a", "operator", "a")
        assert await set_secret(api, "mine", operator, tenants=["a"]) == 200
        seen = (await api.call("GET", "/api/v1/secrets", operator)).json()
        assert {(s["name"], s["owner"]) for s in seen} == {("shared", "all tenants"), ("mine", "a")}
        assert await set_secret(api, "sys2", operator) == 403
        assert await set_secret(api, "all2", operator, all_tenants=True) == 403
        assert await set_secret(api, "other", operator, tenants=["b"]) == 404
        everything = (await api.call("GET", "/api/v1/secrets")).json()
        assert ("fleet-credential", "system") in {(s["name"], s["owner"]) for s in everything}

    async def test_shared_with_every_tenant_or_with_some(self, api):
        """--all-tenants reaches every tenant's jobs (and is audited as such); --tenant
        repeated reaches exactly those tenants."""
        assert await set_secret(api, "everyone", all_tenants=True) == 200
        assert await set_secret(api, "two", tenants=["a", "c"]) == 200
        for tenant in ("a", "b"):
            r = await submit(api, tenant, "everyone")
            assert r.status_code == 201, r.text
        for tenant, status in (("a", 201), ("c", 201), ("b", 404)):
            r = await submit(api, tenant, "two")
            assert r.status_code == status, r.text
        values = await secrets.for_lease(
            api.rt.db, api.rt.secret_key, tenant="b", wanted={"V": "everyone"}
        )
        assert values == {"V": VALUE}
        audit = (await api.call("GET", "/api/v1/audit")).json()
        owners = {e["target"]: e["detail"]["owners"] for e in audit if e["action"] == "secret.set"}
        assert owners == {"everyone": ["all tenants"], "two": ["a", "c"]}

    async def test_a_tenants_own_secret_wins_over_a_shared_one(self, api):
        """A tenant's own secret of the name wins over the one shared with every tenant."""
        assert await set_secret(api, "db", all_tenants=True) == 200
        r = await api.call("PUT", "/api/v1/secrets/db", json={"value": "own", "tenants": ["a"]})
        assert r.status_code == 200
        own = await secrets.for_lease(api.rt.db, api.rt.secret_key, tenant="a", wanted={"V": "db"})
        shared = await secrets.for_lease(
            api.rt.db, api.rt.secret_key, tenant="b", wanted={"V": "db"}
        )
        assert (own, shared) == ({"V": "own"}, {"V": VALUE})

    async def test_remove_names_its_owner(self, api):
        """Removing takes the owner as setting does: a system secret only with no tenant."""
        assert await set_secret(api, "fleet-credential") == 200
        r = await api.call("DELETE", "/api/v1/secrets/fleet-credential", params={"tenant": "a"})
        assert r.status_code == 404
        r = await api.call("DELETE", "/api/v1/secrets/fleet-credential")
        assert r.status_code == 200
        assert (await api.call("GET", "/api/v1/secrets")).json() == []
