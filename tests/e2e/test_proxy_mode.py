"""auth = "proxy": claims from the configured headers, first-match rules, signed writes.

These requests go straight to berth with the headers a proxy would stamp (the nginx test puts a
real proxy in front). A caller no rule matches is refused; berth's own tokens are refused.
"""

import asyncio
import uuid

import httpx
import websockets

from service import protocol

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


def call(s, method, path, headers, **kw) -> httpx.Response:
    return httpx.request(method, f"{s.url}{path}", headers=headers, timeout=30, **kw)


class TestProxyMode:
    def test_rules_decide_callers_and_writes_are_signed(self, server_factory):
        """Admin by group, service by principal glob, member by tenant groups; writes signed."""
        s = server_factory(PROXY, builtin_worker=False)
        r = call(s, "POST", "/api/v1/jobs", ALICE, json={"command": ["true"], "pool": "gpu"})
        assert r.status_code == 201 and r.json()["created_by"] == "human:alice"
        r = call(s, "POST", "/api/v1/jobs", CI, json={"command": ["true"], "pool": "gpu"})
        assert r.status_code == 201, r.text
        assert (r.json()["created_by"], r.json()["tenant"]) == ("service:ci-pipeline", "ml")
        r = call(s, "POST", "/api/v1/jobs", CI, json={"command": ["true"], "tenant": "other"})
        assert r.status_code == 403
        r = call(s, "POST", "/api/v1/jobs", BOB, json={"command": ["true"], "tenant": "vision"})
        assert r.status_code == 201 and r.json()["created_by"] == "human:bob"
        seen = {j["tenant"] for j in call(s, "GET", "/api/v1/jobs", BOB).json()}
        assert seen == {"ml", "vision"}  # not alice's job in "default"
        assert call(s, "GET", "/api/v1/tokens", BOB).status_code == 403
        auditor = {"x-auth-request-user": "eve", "x-auth-request-groups": "auditors"}
        assert call(s, "GET", "/api/v1/jobs", auditor).status_code == 200
        assert (
            call(s, "POST", "/api/v1/jobs", auditor, json={"command": ["true"]}).status_code == 403
        )
        entries = call(s, "GET", "/api/v1/audit", ALICE).json()
        assert {"human:alice", "service:ci-pipeline", "human:bob"} <= {e["caller"] for e in entries}

    def test_refusals(self, server_factory):
        """No rule: 403 naming nothing internal; a brt_ token: 401 saying the proxy decides."""
        s = server_factory(PROXY, builtin_worker=False)
        r = call(s, "GET", "/api/v1/jobs", {"x-auth-request-user": "mallory"})
        assert r.status_code == 403 and r.json()["error"] == "no rule grants you access to berth"
        r = call(s, "GET", "/api/v1/jobs", {"authorization": f"Bearer {s.token}"})
        assert r.status_code == 401 and "proxy" in r.json()["error"]
        r = call(s, "GET", "/api/v1/jobs", {**ALICE, "authorization": f"Bearer {s.token}"})
        assert r.status_code == 401
        # A claim header sent twice (a copy the proxy failed to strip) is trusted in neither copy.
        dup = [
            ("x-auth-request-user", "alice"),
            ("x-auth-request-groups", "berth-admins"),
            ("x-auth-request-groups", "berth-admins"),
        ]
        assert httpx.get(f"{s.url}/api/v1/jobs", headers=dup).status_code == 403
        # The worker header makes no one a worker unless a worker rule matched.
        r = call(
            s,
            "POST",
            "/api/v1/jobs",
            {**BOB, "x-berth-worker": "gpu-7"},
            json={"command": ["true"], "tenant": "ml"},
        )
        assert r.json()["created_by"] == "human:bob"
        # A worker rule without a worker name refuses.
        assert call(s, "GET", "/api/v1/jobs", {"x-jwt-sub": "berth-workers"}).status_code == 403

    def test_worker_with_shared_credential_attaches_and_runs(self, server_factory, tmp_path):
        """A worker matched by the worker rule, named by its header, runs jobs signed worker:<name>."""
        s = server_factory(PROXY, builtin_worker=False)
        url = s.url.replace("http", "ws") + protocol.WORKER_PATH

        async def run() -> None:
            async with websockets.connect(url, additional_headers=WORKER) as ws:
                hello = protocol.Hello(
                    protocol=protocol.PROTOCOL_VERSION,
                    berth_version="t",
                    pool="gpu",
                    instance=uuid.uuid4().hex,
                )
                await ws.send(protocol.encode(hello).decode())
                welcome = protocol.decode_to_worker(await ws.recv())
                assert isinstance(welcome, protocol.Welcome) and welcome.name == "gpu-7"
                job = await asyncio.to_thread(
                    call,
                    s,
                    "POST",
                    "/api/v1/jobs",
                    ALICE,
                    json={"command": ["true"], "pool": "gpu"},
                )
                lease = None
                while not isinstance(lease, protocol.Lease):
                    lease = protocol.decode_to_worker(await asyncio.wait_for(ws.recv(), 10))
                assert lease.job == job.json()["id"]
                done = protocol.Finished(
                    seq=1, job=lease.job, epoch=lease.epoch, state="succeeded", exit_code=0
                )
                await ws.send(protocol.encode(done).decode())
                ack = None
                while not isinstance(ack, protocol.Received):
                    ack = protocol.decode_to_worker(await asyncio.wait_for(ws.recv(), 10))
                assert ack.upto == 1

        asyncio.run(run())
        entries = call(s, "GET", "/api/v1/audit", ALICE).json()
        assert any(e["caller"] == "worker:gpu-7" and e["action"] == "job.finished" for e in entries)

        # A human cannot attach as a worker, whatever header it sends.
        async def human() -> protocol.ToWorker:
            async with websockets.connect(
                url, additional_headers={**BOB, "x-berth-worker": "x"}
            ) as ws:
                return protocol.decode_to_worker(await ws.recv())

        refused = asyncio.run(human())
        assert isinstance(refused, protocol.Refused)


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
    def test_a_tenant_principal_cannot_pose_as_a_live_fleet_worker(self, server_factory):
        """Tenant a's worker principal naming itself like the fleet worker that runs tenant b's
        job is refused: it gets no lease, no relayed answer, and cannot finish b's job."""
        from tests.procs import merge

        s = server_factory(merge(PROXY, IMPOSTOR_RULES), builtin_worker=False)
        url = s.url.replace("http", "ws") + protocol.WORKER_PATH
        impostor = {"x-jwt-sub": "box-a", "x-berth-worker": "gpu-7"}

        def hello(held=()) -> str:
            frame = protocol.Hello(
                protocol=protocol.PROTOCOL_VERSION,
                berth_version="t",
                pool="gpu",
                instance=uuid.uuid4().hex,
                held=held,
            )
            return protocol.encode(frame).decode()

        async def run() -> None:
            async with websockets.connect(url, additional_headers=WORKER) as fleet:
                await fleet.send(hello())
                assert isinstance(protocol.decode_to_worker(await fleet.recv()), protocol.Welcome)
                r = await asyncio.to_thread(
                    call,
                    s,
                    "POST",
                    "/api/v1/jobs",
                    ALICE,
                    json={"command": ["sleep", "60"], "pool": "gpu", "tenant": "b"},
                )
                lease = None
                while not isinstance(lease, protocol.Lease):
                    lease = protocol.decode_to_worker(await asyncio.wait_for(fleet.recv(), 10))
                assert lease.job == r.json()["id"] and lease.tenant == "b"
                key = (lease.job, lease.epoch)
                async with websockets.connect(url, additional_headers=impostor) as ws:
                    await ws.send(hello(held=(key,)))
                    refused = protocol.decode_to_worker(await asyncio.wait_for(ws.recv(), 10))
                    assert isinstance(refused, protocol.Refused)
                # Its own name works, serves tenant a only, and b's lease it names is not its.
                own = {"x-jwt-sub": "box-a", "x-berth-worker": "box-a"}
                async with websockets.connect(url, additional_headers=own) as ws:
                    await ws.send(hello(held=(key,)))
                    welcome = protocol.decode_to_worker(await asyncio.wait_for(ws.recv(), 10))
                    assert isinstance(welcome, protocol.Welcome) and welcome.name == "box-a"
                    assert welcome.drop == (key,)
                    ask = protocol.RelayRequest(
                        id=1, job=key[0], epoch=key[1], method="GET", path="/api/v1/jobs"
                    )
                    await ws.send(protocol.encode(ask).decode())
                    done = protocol.Finished(
                        seq=1, job=key[0], epoch=key[1], state="succeeded", exit_code=0
                    )
                    await ws.send(protocol.encode(done).decode())
                    seen: list[protocol.ToWorker] = []
                    while not any(isinstance(f, protocol.Received) for f in seen) or not any(
                        isinstance(f, protocol.RelayResponse) for f in seen
                    ):
                        seen.append(
                            protocol.decode_to_worker(await asyncio.wait_for(ws.recv(), 10))
                        )
                    answer = next(f for f in seen if isinstance(f, protocol.RelayResponse))
                    assert answer.status == 410
                    assert any(isinstance(f, protocol.Stale) and f.job == key[0] for f in seen)
                shown = await asyncio.to_thread(call, s, "GET", f"/api/v1/jobs/{key[0]}", ALICE)
                assert shown.json()["state"] == "leased" and shown.json()["worker"] == "gpu-7"

        asyncio.run(run())
        assert "belongs to another worker rule" in s.log()

        # A fleet worker may not take the tenant machine's name either.
        async def fleet_as_box() -> protocol.ToWorker:
            headers = {"x-jwt-sub": "berth-workers", "x-berth-worker": "box-a"}
            async with websockets.connect(url, additional_headers=headers) as ws:
                await ws.send(hello())
                return protocol.decode_to_worker(await asyncio.wait_for(ws.recv(), 10))

        assert isinstance(asyncio.run(fleet_as_box()), protocol.Refused)
