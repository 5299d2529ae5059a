"""auth = "proxy" in process: claims from the configured headers, first-match rules, signed
writes, and workers named by their header over the worker socket (tests/fakeworker.py).

These requests reach berth with the headers a proxy would stamp (tests/e2e/test_proxy_nginx.py
puts a real proxy in front). A caller no rule matches is refused; berth's own tokens are refused.
"""

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import structlog

from service import protocol
from tests.fakeworker import FakeWorker, Refused, running
from tests.integration.conftest import Api
from tests.procs import merge

PROXY = {
    "network": {
        "auth": "proxy",
        "tls": "proxy",
        "proxy": {
            "claims": {
                "user": "x-auth-request-user",
                "groups": "x-auth-request-groups",
                "principal": "x-jwt-sub",
            },
            "name_claims": ["user", "principal"],
            "worker_header": "x-berth-worker",
            "rules": [
                {"when": {"groups": "berth-admins"}, "role": "admin"},
                {
                    "when": {"principal": "ci-*"},
                    "caller": "service",
                    "role": "member",
                    "tenants": ["ml"],
                },
                {"when": {"principal": "berth-workers"}, "caller": "worker"},
                {
                    "when": {"groups": "team-*"},
                    "role": "member",
                    "tenants_from": "groups",
                    "tenant_prefix": "team-",
                },
                {"when": {"groups": "auditors"}, "role": "viewer", "tenants": ["ml"]},
            ],
        },
    },
    "pools": {"gpu": {"slots": {"default": 2}}},
}
ALICE = {"x-auth-request-user": "alice", "x-auth-request-groups": "dev,berth-admins"}
CI = {"x-jwt-sub": "ci-pipeline"}
BOB = {"x-auth-request-user": "bob", "x-auth-request-groups": "team-ml, team-vision"}
WORKER = {"x-jwt-sub": "berth-workers", "x-berth-worker": "gpu-7"}


@pytest.fixture
async def proxied(
    api_with: Callable[[dict[str, Any]], Awaitable[Api]],
) -> Callable[[dict[str, Any]], Awaitable[Api]]:
    """`await proxied(extra)`: the in-process app on PROXY merged with `extra`, its channel
    running (one per test)."""
    return lambda extra: api_with(merge(PROXY, extra))


@pytest.fixture
async def s(proxied: Callable[[dict[str, Any]], Awaitable[Api]], db_url: str) -> AsyncIterator[Api]:
    api = await proxied({})
    async with running(api, db_url):
        yield api


async def call(s: Api, method: str, path: str, headers: Any, **kw: Any) -> httpx.Response:
    return await s.client.request(method, path, headers=headers, **kw)


def worker(s: Api, headers: dict[str, str], **kw: Any) -> FakeWorker:
    return FakeWorker(app=s.app, headers=headers, **kw)


class TestProxyMode:
    async def test_rules_decide_callers_and_writes_are_signed(self, s: Api):
        """Admin by group, service by principal glob, member by tenant groups; writes signed."""
        r = await call(s, "POST", "/api/v1/jobs", ALICE, json={"command": ["true"], "pool": "gpu"})
        assert r.status_code == 201 and r.json()["created_by"] == "human:alice"
        r = await call(s, "POST", "/api/v1/jobs", CI, json={"command": ["true"], "pool": "gpu"})
        assert r.status_code == 201, r.text
        assert (r.json()["created_by"], r.json()["tenant"]) == ("service:ci-pipeline", "ml")
        r = await call(s, "POST", "/api/v1/jobs", CI, json={"command": ["true"], "tenant": "other"})
        assert r.status_code == 403
        r = await call(
            s, "POST", "/api/v1/jobs", BOB, json={"command": ["true"], "tenant": "vision"}
        )
        assert r.status_code == 201 and r.json()["created_by"] == "human:bob"
        seen = {j["tenant"] for j in (await call(s, "GET", "/api/v1/jobs", BOB)).json()}
        assert seen == {"ml", "vision"}  # not alice's job in "default"
        assert (await call(s, "GET", "/api/v1/tokens", BOB)).status_code == 403
        auditor = {"x-auth-request-user": "eve", "x-auth-request-groups": "auditors"}
        assert (await call(s, "GET", "/api/v1/jobs", auditor)).status_code == 200
        r = await call(s, "POST", "/api/v1/jobs", auditor, json={"command": ["true"]})
        assert r.status_code == 403
        entries = (await call(s, "GET", "/api/v1/audit", ALICE)).json()
        assert {"human:alice", "service:ci-pipeline", "human:bob"} <= {e["caller"] for e in entries}

    async def test_refusals(self, s: Api):
        """No rule: 403 naming nothing internal; a brt_ token: 401 saying the proxy decides."""
        r = await call(s, "GET", "/api/v1/jobs", {"x-auth-request-user": "mallory"})
        assert r.status_code == 403 and r.json()["error"] == "no rule grants you access to berth"
        r = await call(s, "GET", "/api/v1/jobs", {"authorization": f"Bearer {s.admin}"})
        assert r.status_code == 401 and "proxy" in r.json()["error"]
        r = await call(s, "GET", "/api/v1/jobs", {**ALICE, "authorization": f"Bearer {s.admin}"})
        assert r.status_code == 401
        # A claim header sent twice (a copy the proxy failed to strip) is trusted in neither copy.
        dup = [
            ("x-auth-request-user", "alice"),
            ("x-auth-request-groups", "berth-admins"),
            ("x-auth-request-groups", "berth-admins"),
        ]
        assert (await call(s, "GET", "/api/v1/jobs", dup)).status_code == 403
        # The worker header makes no one a worker unless a worker rule matched.
        r = await call(
            s,
            "POST",
            "/api/v1/jobs",
            {**BOB, "x-berth-worker": "gpu-7"},
            json={"command": ["true"], "tenant": "ml"},
        )
        assert r.json()["created_by"] == "human:bob"
        # A worker rule without a worker name refuses.
        r = await call(s, "GET", "/api/v1/jobs", {"x-jwt-sub": "berth-workers"})
        assert r.status_code == 403

    async def test_worker_with_shared_credential_attaches_and_runs(self, s: Api):
        """A worker matched by the worker rule, named by its header, runs jobs signed
        worker:<name>; a human cannot attach as a worker, whatever header it sends."""
        fake = worker(s, WORKER)
        welcome = await fake.connect()
        assert welcome.name == "gpu-7"
        r = await call(s, "POST", "/api/v1/jobs", ALICE, json={"command": ["true"], "pool": "gpu"})
        lease = await fake.lease()
        assert lease.job == r.json()["id"]
        await fake.report(
            protocol.Finished(
                seq=1, job=lease.job, epoch=lease.epoch, state="succeeded", exit_code=0
            )
        )
        entries = (await call(s, "GET", "/api/v1/audit", ALICE)).json()
        assert any(e["caller"] == "worker:gpu-7" and e["action"] == "job.finished" for e in entries)
        with pytest.raises(Refused):
            await worker(s, {**BOB, "x-berth-worker": "x"}).connect()


IMPOSTOR_RULES = {
    "network": {
        "proxy": {
            "rules": [
                {"when": {"groups": "berth-admins"}, "role": "admin"},
                # A tenant's own machine: its principal's own name only.
                {"when": {"principal": "box-a"}, "caller": "worker", "tenants": ["a"]},
                {"when": {"principal": "berth-workers"}, "caller": "worker"},
            ]
        }
    }
}


class TestWorkerNamesAreNotIdentities:
    async def test_a_tenant_principal_cannot_pose_as_a_live_fleet_worker(
        self, proxied: Callable[[dict[str, Any]], Awaitable[Api]], db_url: str
    ):
        """Tenant a's worker principal naming itself like the fleet worker that runs tenant b's
        job is refused: it gets no lease, no relayed answer, and cannot finish b's job."""
        s = await proxied(IMPOSTOR_RULES)
        async with running(s, db_url):
            fleet = worker(s, WORKER)
            await fleet.connect()
            r = await call(
                s,
                "POST",
                "/api/v1/jobs",
                ALICE,
                json={"command": ["sleep", "60"], "pool": "gpu", "tenant": "b"},
            )
            lease = await fleet.lease()
            assert lease.job == r.json()["id"] and lease.tenant == "b"
            key = (lease.job, lease.epoch)
            impostor = {"x-jwt-sub": "box-a", "x-berth-worker": "gpu-7"}
            with structlog.testing.capture_logs() as logs, pytest.raises(Refused):
                await worker(s, impostor, held=(key,)).connect()
            assert any("belongs to another worker rule" in str(e) for e in logs), logs
            # Its own name works, serves tenant a only, and b's lease it names is not its.
            own = worker(s, {"x-jwt-sub": "box-a", "x-berth-worker": "box-a"}, held=(key,))
            welcome = await own.connect()
            assert welcome.name == "box-a" and welcome.drop == (key,)
            own.send(
                protocol.RelayRequest(
                    id=1, job=key[0], epoch=key[1], method="GET", path="/api/v1/jobs"
                )
            )
            own.send(
                protocol.Finished(seq=1, job=key[0], epoch=key[1], state="succeeded", exit_code=0)
            )
            assert (await own.next(protocol.RelayResponse)).status == 410
            assert (await own.next(protocol.Stale)).job == key[0]
            await own.next(protocol.Received)
            shown = (await call(s, "GET", f"/api/v1/jobs/{key[0]}", ALICE)).json()
            assert (shown["state"], shown["worker"]) == ("leased", "gpu-7")
            # A fleet worker may not take the tenant machine's name either.
            with pytest.raises(Refused):
                await worker(s, {"x-jwt-sub": "berth-workers", "x-berth-worker": "box-a"}).connect()
