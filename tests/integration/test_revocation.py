"""Revoking tokens: never the last admin or one's own credential by accident, never a stronger
caller's token, and the last-admin rule holds under concurrency."""

import asyncio

from service.auth.callers import Caller, Kind, Role
from service.core.errors import Conflict
from service.db.engine import Database
from service.domain import tokens
from tests.integration.conftest import Api


class TestLastAdmin:
    async def test_the_only_admin_token_is_not_revoked(self, api: Api):
        """409 naming the reason, and the token still works."""
        r = await api.call("DELETE", "/api/v1/tokens/admin")
        assert r.status_code == 409
        assert "last live admin token" in r.json()["error"]
        other = await api.mint("ops", "operator", "a")
        assert (await api.call("GET", "/api/v1/jobs")).status_code == 200
        r = await api.call("DELETE", "/api/v1/tokens/admin", token=other)
        assert r.status_code == 403  # an operator cannot revoke an admin token at all

    async def test_with_two_admins_one_may_go(self, api: Api):
        """Of two admin tokens one is revoked; then the other is the last, and refused."""
        second = await api.mint("admin2", "admin")
        r = await api.call("DELETE", "/api/v1/tokens/admin", token=second)
        assert r.status_code == 200 and r.json()["yours"] is False
        r = await api.call("DELETE", "/api/v1/tokens/admin2", token=second, params={"force": "x"})
        assert r.status_code == 400  # force is a boolean
        r = await api.call("DELETE", "/api/v1/tokens/admin2", token=second)
        assert r.status_code == 409 and "last live admin token" in r.json()["error"]
        assert (await api.call("GET", "/api/v1/jobs", token=second)).status_code == 200

    async def test_own_credential_needs_force(self, api: Api):
        """With another admin left, revoking the token in use still asks for --force."""
        await api.mint("admin2", "admin")
        r = await api.call("DELETE", "/api/v1/tokens/admin")
        assert r.status_code == 409 and "token you are using" in r.json()["error"]
        r = await api.call("DELETE", "/api/v1/tokens/admin", params={"force": "true"})
        assert r.status_code == 200 and r.json()["yours"] is True

    async def test_force_revokes_the_last_and_says_it_was_yours(self, api: Api):
        """--force revokes it; the answer says it was the caller's own credential."""
        r = await api.call("DELETE", "/api/v1/tokens/admin", params={"force": "true"})
        assert r.status_code == 200 and r.json()["yours"] is True
        assert (await api.call("GET", "/api/v1/jobs")).status_code == 401

    async def test_two_concurrent_revokes_leave_one(self, db: Database):
        """Two revokes racing for the last two admin tokens: exactly one succeeds."""
        root = Caller(Kind.HUMAN, "root", Role.ADMIN, frozenset())
        for name in ("a1", "a2"):
            await tokens.create(db, root, name=name, kind="admin", tenants=[], expires_days=1)
        for _ in range(5):  # a few rounds: the race must hold every time
            results = await asyncio.gather(
                tokens.revoke(db, root, name="a1"),
                tokens.revoke(db, root, name="a2"),
                return_exceptions=True,
            )
            refused = [r for r in results if isinstance(r, Conflict)]
            assert len(refused) == 1 and "last live admin" in refused[0].message
            live = {t.name for t in await tokens.list_visible(db, root) if t.revoked_at is None}
            assert len(live & {"a1", "a2"}) == 1
            (left,) = live & {"a1", "a2"}
            gone = "a2" if left == "a1" else "a1"
            await tokens.create(db, root, name=gone, kind="admin", tenants=[], expires_days=1)


class TestWhoMayRevoke:
    async def test_operator_revokes_only_what_it_could_mint(self, api: Api):
        """An operator of a revokes a's worker token; another tenant's is 404, an admin's 403."""
        op = await api.mint("op-a", "operator", "a")
        await api.mint("a-box", "worker", "a")
        await api.mint("b-box", "worker", "b")
        assert (await api.call("DELETE", "/api/v1/tokens/a-box", token=op)).status_code == 200
        assert (await api.call("DELETE", "/api/v1/tokens/b-box", token=op)).status_code in (
            403,
            404,
        )
        assert (await api.call("DELETE", "/api/v1/tokens/admin", token=op)).status_code == 403
        names = {
            t["name"]: t["revoked_at"] for t in (await api.call("GET", "/api/v1/tokens")).json()
        }
        assert names["b-box"] is None and names["admin"] is None

    async def test_weaker_tokens_cannot_revoke_themselves(self, api: Api):
        """An operator token is not one an operator mints; a service has no token powers."""
        op = await api.mint("op-a", "operator", "a")
        r = await api.call("DELETE", "/api/v1/tokens/op-a", token=op)
        assert r.status_code == 403  # an operator token is not one an operator could mint
        svc = await api.mint("svc", "service", "a")
        assert (await api.call("DELETE", "/api/v1/tokens/svc", token=svc)).status_code == 403
