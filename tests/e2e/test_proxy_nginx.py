"""berth with auth = "proxy" behind a real nginx (auth_request to tests/proxy/authstub.py).

Every request here goes through nginx, never to berth's own port: people come with a session
cookie, the ci-pipeline service account and the workers with a bearer secret the stub knows.
"""

import json
import select
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pexpect
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from service import protocol
from service.core.exits import Exit
from tests.procs import Server, wait_for
from tests.proxy.authstub import SERVICE_SECRET, WORKER_SECRET
from tests.proxy.harness import ProxyFront

CONFIG = {
    "network": {
        "auth": "proxy",
        "tls": "proxy",
        "proxy": {
            "claims": {
                "user": "x-auth-request-user",
                "email": "x-auth-request-email",
                "groups": "x-auth-request-groups",
                "principal": "x-auth-request-principal",
            },
            "name_claims": ["user", "principal"],
            "worker_header": "x-berth-worker",
            "rules": [
                {"when": {"groups": "berth-admins"}, "role": "admin"},
                {
                    "when": {"principal": "ci-pipeline"},
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
            ],
        },
    },
    "pools": {"gpu": {"slots": {"default": 2}}},
}

ALICE = [("Cookie", "session=alice")]  # berth-admins
BOB = [("Cookie", "session=bob")]  # team-ml
CAROL = [("Cookie", "session=carol")]  # team-other
MALLORY = [("Cookie", "session=mallory")]  # no groups: no rule
CI = [("Authorization", f"Bearer {SERVICE_SECRET}")]
FORGED = [
    ("X-Auth-Request-User", "admin"),
    ("X-Auth-Request-Groups", "berth-admins"),
    ("X-Auth-Request-Principal", "ci-pipeline"),
    ("X_Auth_Request_User", "admin"),
]
TRUE = {"command": ["true"], "pool": "gpu"}


@dataclass
class Stack:
    server: Server
    front: ProxyFront

    def call(self, who: list[tuple[str, str]], method: str, path: str, **kw: Any) -> httpx.Response:
        """One request through nginx with exactly the headers `who` (nothing of berth's own)."""
        return httpx.request(method, self.front.url + path, headers=who, timeout=30, **kw)

    def job(self, job_id: int) -> dict[str, Any]:
        r = self.call(ALICE, "GET", f"/api/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def submit(self, who: list[tuple[str, str]], body: dict[str, Any]) -> dict[str, Any]:
        r = self.call(who, "POST", "/api/v1/jobs", json=body)
        assert r.status_code == 201, (r.status_code, r.text)
        return self.job(r.json()["id"])

    def audit(self) -> set[tuple[str, str, str]]:
        r = self.call(ALICE, "GET", "/api/v1/audit", params={"limit": 1000})
        assert r.status_code == 200, r.text
        return {(e["caller"], e["action"], str(e["target"])) for e in r.json()}


@dataclass
class Front:
    """The server as a worker sees it: nginx's address instead of berth's own."""

    server: Server
    url: str

    def env(self, **extra: str) -> dict[str, str]:
        return self.server.env(**{"BERTH_SERVER": self.url, **extra})


@pytest.fixture
def proxied(tmp_path) -> Iterator[Any]:
    """proxied(server): nginx + auth stub in front of that server; stopped at the end."""
    fronts: list[ProxyFront] = []

    def make(server: Server, headers_more: bool | None = None) -> ProxyFront:
        prefix = tmp_path / f"nginx-{len(fronts)}"
        front = ProxyFront(prefix, f"127.0.0.1:{server.port}", headers_more=headers_more)
        fronts.append(front)
        return front.start()

    yield make
    for front in fronts:
        front.stop()


@pytest.fixture
def stack(request, server_factory, proxied) -> Stack:
    """berth in proxy mode behind nginx; param: headers-more on/off (default: when installed)."""
    server = server_factory(CONFIG, builtin_worker=False)
    return Stack(server, proxied(server, getattr(request, "param", None)))


# The claim strip must hold with the wildcard (headers-more) and with stock nginx directives alone.
BOTH_NGINX = pytest.mark.parametrize(
    "stack", [True, False], ids=["headers-more", "stock"], indirect=True
)


def attach_refused(stack: Stack, who: list[tuple[str, str]]) -> str:
    """Open the worker websocket as `who`: how it was refused (AssertionError if welcomed)."""
    url = stack.front.ws_url + protocol.WORKER_PATH
    try:
        ws = connect(url, additional_headers=who, open_timeout=10)
    except InvalidStatus as e:
        return f"http {e.response.status_code}"
    closed: ConnectionClosed | None = None
    with ws:
        try:
            while True:
                frame = json.loads(ws.recv(timeout=15))
                assert frame.get("type") != "welcome.v1", frame
        except ConnectionClosed as e:
            closed = e
    assert closed is not None and closed.rcvd is not None, closed
    assert closed.rcvd.code >= 4000, closed  # berth's own refusal codes, not a plain drop
    return f"closed {closed.rcvd.code}: {closed.rcvd.reason}"


class TestAdmin:
    def test_alice_submits_lists_workers_creates_a_token_and_reads_audit(self, stack):
        """An SSO admin (berth-admins) may do everything, and her writes are signed human:alice."""
        job = stack.submit(ALICE, TRUE)
        assert job["created_by"] == "human:alice"
        assert stack.call(ALICE, "GET", "/api/v1/workers").status_code == 200
        r = stack.call(ALICE, "POST", "/api/v1/tokens", json={"name": "x", "kind": "service"})
        assert r.status_code == 201, r.text
        audit = stack.audit()
        assert ("human:alice", "job.submitted", str(job["id"])) in audit
        assert ("human:alice", "token.created", "x") in audit


class TestServiceAccount:
    def test_ci_pipeline_submits_into_its_tenant_only(self, stack):
        """The ci-pipeline bearer is service:ci-pipeline in tenant ml, and refused tenant other."""
        job = stack.submit(CI, TRUE)
        assert (job["created_by"], job["tenant"]) == ("service:ci-pipeline", "ml")
        r = stack.call(CI, "POST", "/api/v1/jobs", json={**TRUE, "tenant": "other"})
        assert r.status_code == 403, r.text


class TestWorker:
    def test_worker_attaches_through_nginx_and_runs_a_job(self, stack, worker_factory):
        """A worker with the shared credential attaches via nginx's websocket and runs a job."""
        via = Front(stack.server, stack.front.url)
        w = worker_factory(via, WORKER_SECRET, "gpu", "--name", "gpu-w1", name="gpu-w1")

        def attached() -> bool:
            assert w.proc is not None and w.proc.poll() is None, w.wait(5)
            workers = stack.call(ALICE, "GET", "/api/v1/workers").json()
            return any(x["name"] == "gpu-w1" and x["attached"] for x in workers)

        wait_for(attached, 30, "gpu-w1 attached through nginx")
        job = stack.submit(ALICE, {"command": ["sh", "-c", "echo via-nginx"], "pool": "gpu"})
        done = wait_for(
            lambda: (j := stack.job(job["id"]))["state"] in {"succeeded", "failed"} and j,
            30,
            "the job to finish",
        )
        assert (done["state"], done["worker"]) == ("succeeded", "gpu-w1"), done
        assert ("worker:gpu-w1", "job.finished", str(job["id"])) in stack.audit()
        assert {"principal": "berth-workers"} in stack.front.stub.checks  # it came through nginx


class TestRefused:
    def test_a_caller_no_rule_matches_gets_403_json(self, stack):
        """mallory is authenticated by the proxy but matches no rule: 403 with a JSON error."""
        r = stack.call(MALLORY, "GET", "/api/v1/jobs")
        assert r.status_code == 403
        assert r.json()["error"]

    def test_a_berth_token_is_refused_naming_the_proxy(self, stack):
        """berth's own (valid) admin token gets 401: the proxy is the authentication."""
        r = stack.call([("Authorization", f"Bearer {stack.server.token}")], "GET", "/api/v1/jobs")
        assert r.status_code == 401, r.text
        assert "proxy" in r.json()["error"]


@BOTH_NGINX
class TestForgedHeaders:
    def test_forged_claim_headers_gain_carol_nothing(self, stack):
        """carol sending admin/ci-pipeline claim headers stays a member of tenant other."""
        r = stack.call(CAROL + FORGED, "GET", "/api/v1/tokens")
        assert r.status_code == 403, r.text
        job = stack.submit(CAROL + FORGED, TRUE)
        assert (job["created_by"], job["tenant"]) == ("human:carol", "other")

    def test_forged_claims_without_a_credential_get_401_from_nginx(self, stack):
        """No credential but forged claim headers: nginx answers 401 and berth is not reached."""
        r = stack.call(FORGED, "GET", "/api/v1/jobs")
        assert r.status_code == 401
        assert r.json() == {"error": "not authenticated by the proxy"}  # nginx's, not berth's

    def test_a_worker_header_does_not_make_bob_a_worker(self, stack):
        """bob sending X-Berth-Worker stays human:bob and cannot open the worker websocket."""
        spoof = [*BOB, ("X-Berth-Worker", "gpu-w1")]
        job = stack.submit(spoof, TRUE)
        assert (job["created_by"], job["tenant"]) == ("human:bob", "ml")
        how = attach_refused(stack, spoof)
        assert how.startswith(("http 401", "http 403", "closed")), how
        workers = stack.call(ALICE, "GET", "/api/v1/workers").json()
        assert all(w["name"] != "gpu-w1" for w in workers)


EXEC_CONFIG = {**CONFIG, "pools": {"gpu": {"slots": {"default": 2}, "exec": "member"}}}


class TestExec:
    def test_exec_through_nginx(self, server_factory, proxied, worker_factory):
        """`berth job exec` (and --tty) through nginx: the service account (a member of ml)
        reads what its job wrote; carol (tenant other) gets 404 for it."""
        server = server_factory(EXEC_CONFIG, builtin_worker=False)
        stack = Stack(server, proxied(server))
        via = Front(server, stack.front.url)
        worker_factory(via, WORKER_SECRET, "gpu", "--name", "gpu-w1", name="gpu-w1")
        script = "echo through-nginx > mine.txt; echo ready; exec sleep 600"
        job = stack.submit(CI, {"command": ["sh", "-c", script], "pool": "gpu"})["id"]
        wait_for(lambda: stack.job(job)["state"] == "running", 60, "the job running")
        env = via.env(BERTH_TOKEN=SERVICE_SECRET)
        argv = [sys.executable, "-m", "service", "job", "exec", str(job), "--", "cat", "mine.txt"]

        def cat() -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=60, check=False
            )

        r = wait_for(lambda: (c := cat()).returncode == 0 and c, 30, "mine.txt written")
        assert r.stdout == "through-nginx\n"
        child = pexpect.spawn(
            sys.executable,
            ["-m", "service", "job", "exec", str(job), "--tty", "--", "stty", "size"],
            env=env,
            dimensions=(31, 97),
            timeout=60,
        )
        child.expect("31 97")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
        url = stack.front.ws_url + f"/api/v1/jobs/{job}/exec"
        with connect(url, additional_headers=CAROL, open_timeout=10) as ws:
            ws.send(json.dumps({"command": ["true"]}))
            said = json.loads(ws.recv(timeout=15))
        assert (said["type"], said["status"]) == ("error", 404), said
        assert ("service:ci-pipeline", "job.exec", str(job)) in stack.audit()
        # a bearer no rule admits: refused in one line, as any other command is
        env["BERTH_TOKEN"] = "brt_nobody"
        bad = cat()
        assert bad.returncode == Exit.REFUSED, bad.stderr
        assert bad.stderr.strip().splitlines() == [
            "berth: error: no rule grants you access to berth"
        ], bad.stderr


class TestFollowThroughNginx:
    def test_logs_follow_sees_output_as_it_is_produced_and_the_end(
        self, stack, worker_factory, shared_dir
    ):
        """`berth job logs -f` through nginx: the first line arrives while the job still runs
        (nginx does not buffer the event stream), then the rest and the job's code."""
        via = Front(stack.server, stack.front.url)
        worker_factory(via, WORKER_SECRET, "gpu", "--name", "gpu-w1", name="gpu-w1")
        gate = shared_dir / "gate"
        script = f"echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second; exit 5"
        job = stack.submit(CI, {"command": ["sh", "-c", script], "pool": "gpu"})["id"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "job", "logs", "-f", str(job)],
            env=via.env(BERTH_TOKEN=SERVICE_SECRET),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "no output through nginx while the job runs"
        assert proc.stdout.readline() == "first\n"
        assert stack.job(job)["state"] == "running"  # it came while the job was running
        gate.touch()
        out, err = proc.communicate(timeout=120)
        assert (proc.returncode, out) == (5, "second\n"), err
