"""The fleet through a tenant's eyes (SPEC section 8): a tenant's operator drains, disables and
enables only its tenants' own workers, and listings name no tenant but the caller's own.

Worker rows are made by the real attach (leasing.attach, with a hello as a worker sends it)
for worker tokens minted over the API.
"""

from service import protocol
from service.db.records import WorkerRecord
from service.domain import dispatch, leasing, tokens
from tests.integration.conftest import Api

# Tenant names that appear nowhere else in the answers (a test looks for them in the JSON).
ALPHA, BRAVO = "alpha-co", "bravo-co"


async def attach(api: Api, name: str, *tenants: str) -> WorkerRecord:
    """A worker `name` with a token of these tenants ([]: fleet-wide), attached to pool gpu."""
    token = await api.mint(name, "worker", *tenants)
    caller = await tokens.authenticate(api.rt.db, token)
    hello = protocol.Hello(
        protocol=protocol.PROTOCOL_VERSION,
        berth_version="test",
        pool="gpu",
        instance=f"instance-{name}",
        parallel=1,
    )
    attached = await leasing.attach(
        api.rt.db, caller, hello, server_id=api.rt.server_id, pools=api.rt.pools
    )
    return attached.worker


async def fleet(api: Api) -> dict[str, WorkerRecord]:
    """The four kinds of worker: fleet-wide, alpha's own, shared by both, bravo's own."""
    return {
        "fleet": await attach(api, "fleet"),
        "own": await attach(api, "own", ALPHA),
        "shared": await attach(api, "shared", ALPHA, BRAVO),
        "theirs": await attach(api, "theirs", BRAVO),
    }


async def states(api: Api) -> dict[str, str]:
    r = await api.call("GET", "/api/v1/workers")
    return {w["name"]: w["state"] for w in r.json()}


class TestChangingState:
    async def test_a_tenants_operator_changes_only_workers_of_its_tenants_alone(self, api: Api):
        """alpha's operator drains, disables and enables alpha's own worker; the fleet-wide
        and the shared one are 403 saying why, bravo's is a 404 like a missing one, and none
        of those changes; an operator bound to no tenant (and an admin) changes them all."""
        await fleet(api)
        op = await api.mint("op-alpha", "operator", ALPHA)
        for action, state in (("drain", "draining"), ("disable", "disabled"), ("enable", "active")):
            r = await api.call("POST", f"/api/v1/workers/own/{action}", op)
            assert r.status_code == 200, r.text
            assert (r.json()["name"], r.json()["state"]) == ("own", state)
        for action in ("drain", "disable", "enable"):
            r = await api.call("POST", f"/api/v1/workers/fleet/{action}", op)
            assert r.status_code == 403, r.text
            assert "serves every tenant" in r.json()["error"]
            assert "fleet-wide operator" in r.json()["error"]
            r = await api.call("POST", f"/api/v1/workers/shared/{action}", op)
            assert r.status_code == 403, r.text
            assert "also serves tenants that are not yours" in r.json()["error"]
            assert BRAVO not in r.text
            theirs = await api.call("POST", f"/api/v1/workers/theirs/{action}", op)
            missing = await api.call("POST", f"/api/v1/workers/nobody/{action}", op)
            assert theirs.status_code == missing.status_code == 404
            assert theirs.json()["error"] == missing.json()["error"].replace("nobody", "theirs")
        assert await states(api) == {
            "fleet": "active",
            "own": "active",
            "shared": "active",
            "theirs": "active",
        }
        fleet_op = await api.mint("op-fleet", "operator")
        for name in ("fleet", "shared", "theirs"):
            r = await api.call("POST", f"/api/v1/workers/{name}/drain", fleet_op)
            assert r.status_code == 200, r.text
        r = await api.call("POST", "/api/v1/workers/own/disable")  # the admin
        assert r.status_code == 200, r.text
        assert await states(api) == {
            "fleet": "draining",
            "own": "disabled",
            "shared": "draining",
            "theirs": "draining",
        }


class TestListings:
    async def test_a_member_sees_no_tenant_name_but_its_own(self, api: Api):
        """alpha's member and operator list workers, pools and status while bravo has a job
        running and one queued: bravo's own worker is not listed, and no answer names bravo;
        the fleet-wide and shared workers are listed with alpha's name only. An operator bound
        to no tenant sees every worker with all its tenants."""
        workers = await fleet(api)
        for _ in range(2):
            r = await api.call("POST", "/api/v1/jobs", json={"command": ["true"], "tenant": BRAVO})
            assert r.status_code == 201, r.text
        granted = await dispatch.run_pass(api.rt.db, [workers["theirs"].id], api.rt.pools)
        assert len(granted.grants) == 1  # one running on bravo's worker, one queued
        # What an admin sees: bravo is there to be hidden.
        status = (await api.call("GET", "/api/v1/status")).json()
        assert status["running_by_tenant"] == {BRAVO: 1}
        listed = {
            w["name"]: w["tenants"] for w in (await api.call("GET", "/api/v1/workers")).json()
        }
        assert listed == {"fleet": [], "own": [ALPHA], "shared": [ALPHA, BRAVO], "theirs": [BRAVO]}

        member = await api.mint("ci-alpha", "service", ALPHA)
        operator = await api.mint("op-alpha", "operator", ALPHA)
        for who in (member, operator):
            r = await api.call("GET", "/api/v1/workers", who)
            assert r.status_code == 200, r.text
            listed = {w["name"]: w["tenants"] for w in r.json()}
            assert listed == {"fleet": [], "own": [ALPHA], "shared": [ALPHA]}
            for path in ("/api/v1/workers", "/api/v1/pools", "/api/v1/status"):
                r = await api.call("GET", path, who)
                assert r.status_code == 200, r.text
                assert BRAVO not in r.text and "theirs" not in r.text, (path, r.text)
            status = (await api.call("GET", "/api/v1/status", who)).json()
            assert status["running_by_tenant"] == {}
            assert status["queued"] == [{"pool": None, "kind": "default", "jobs": 1}]
        fleet_op = await api.mint("op-fleet", "operator")
        r = await api.call("GET", "/api/v1/workers", fleet_op)
        listed = {w["name"]: w["tenants"] for w in r.json()}
        assert listed == {"fleet": [], "own": [ALPHA], "shared": [ALPHA, BRAVO], "theirs": [BRAVO]}
        assert (await api.call("GET", "/api/v1/status", fleet_op)).json()["running_by_tenant"] == {
            BRAVO: 1
        }
