"""Approvals end to end (issue 18): a server, a remote worker, and jobs that ask with the
runtime (`request_approval`) or their own `berth approval request`, through the relay; members
answer with the real CLI. Tenant a has two members: alice (who submits) and bob."""

import asyncio
import json
import signal
import textwrap
from collections.abc import Iterator

import asyncpg
import pytest

from tests.e2e.test_job_io import remote
from tests.e2e.test_proxy_nginx import ALICE, BOB, CAROL, CI, CONFIG, Front, Stack
from tests.procs import merge, wait_for
from tests.proxy.authstub import WORKER_SECRET
from tests.proxy.harness import ProxyFront

ASKS = textwrap.dedent(
    """
    from berth_runtime import request_approval
    approved = request_approval("deploy v2", "to prod, all regions")
    print("approved:", approved, flush=True)
    raise SystemExit(0 if approved else 3)
    """
)


def gpu(**pool: object) -> dict:
    return {"pools": {"gpu": {"slots": {"default": 2}, **pool}}}


@pytest.fixture
def tenant_a(server_factory, worker_factory):
    def make(config: dict):
        s = server_factory(config, builtin_worker=False)
        remote(s, worker_factory)
        members = {}
        for name in ("alice", "bob"):
            r = s.cli("token", "create", name, "--kind", "service", "--tenant", "a")
            assert r.code == 0, r.err
            members[name] = r.out.strip()
        return s, members["alice"], members["bob"]

    return make


def submit(s, token: str, tmp_path, source: str = ASKS) -> int:
    script = tmp_path / "asks.py"
    script.write_text(source)
    r = s.cli("job", "submit", "--pool", "gpu", "--python", str(script), token=token)
    assert r.code == 0, r.err
    return int(r.out.split()[0])


def pending(s, token: str, job: int) -> dict:
    """The job's pending request, once it asked (`berth approval list`)."""

    def find() -> dict | None:
        r = s.cli("approval", "list", "--job", str(job), "--json", token=token)
        assert r.code == 0, r.err
        return next(iter(json.loads(r.out)), None)

    return wait_for(find, 60, f"job {job} to ask for approval")


def ended(s, token: str, job: int) -> tuple[int, str]:
    """(exit code of `berth job wait`, the job's output)."""
    r = s.cli("job", "wait", str(job), token=token, timeout=120)
    out = s.cli("job", "logs", str(job), token=token)
    return r.code, out.out


def audit(s, approval: int) -> list[tuple[str, str]]:
    r = s.cli("audit", "list", "--json", "--limit", "500")
    assert r.code == 0, r.err
    return sorted(
        (e["action"], e["caller"])
        for e in json.loads(r.out)
        if e["action"].startswith("approval.") and e["target"] == str(approval)
    )


class TestApprovals:
    def test_approved_by_another_member_after_the_creator_is_refused(self, tenant_a, tmp_path):
        """The job blocks (job show: waits for approval: deploy v2); alice, its creator, is
        refused; bob approves; the job goes on with True; audit list has all of it."""
        s, alice, bob = tenant_a(gpu())
        job = submit(s, alice, tmp_path)
        asked = pending(s, bob, job)
        assert (asked["state"], asked["title"], asked["policy"]) == (
            "pending",
            "deploy v2",
            "four-eyes",
        )
        shown = s.cli("job", "show", str(job), token=bob)
        assert shown.code == 0, shown.err
        line = next(x for x in shown.out.splitlines() if x.startswith("waiting for"))
        assert "approval: deploy v2" in line, shown.out
        assert "state         running" in shown.out  # it holds its slot while it waits

        own = s.cli("approval", "approve", str(asked["id"]), token=alice)
        assert own.code != 0
        assert own.err.count("\n") == 1 and "four-eyes" in own.err, own.err
        assert "service:alice" in own.err

        yes = s.cli("approval", "approve", str(asked["id"]), "--reason", "checked", token=bob)
        assert yes.code == 0, yes.err
        assert f"approval {asked['id']} approved" in yes.out
        code, out = ended(s, bob, job)
        assert (code, "approved: True" in out) == (0, True), out
        assert audit(s, asked["id"]) == sorted(
            [
                ("approval.requested", f"job:{job}"),
                ("approval.refused", "service:alice"),
                ("approval.approved", "service:bob"),
            ]
        )

    def test_denied_and_the_relayed_cli(self, tenant_a, tmp_path):
        """The job's own `berth approval request` exits 1 after bob denies; the job sees it."""
        s, alice, bob = tenant_a(gpu())
        source = textwrap.dedent(
            """
            import subprocess, sys
            r = subprocess.run(["berth", "approval", "request", "drop the old table",
                                "--details", "users_v1"], capture_output=True, text=True)
            print("said:", r.stdout.strip(), "code:", r.returncode, r.stderr.strip(), flush=True)
            sys.exit(r.returncode)
            """
        )
        job = submit(s, alice, tmp_path, source)
        asked = pending(s, bob, job)
        assert asked["details"] == "users_v1"
        no = s.cli("approval", "deny", str(asked["id"]), "--reason", "not today", token=bob)
        assert no.code == 0, no.err
        code, out = ended(s, bob, job)
        assert code == 1 and "said: denied code: 1" in out, out
        shown = json.loads(s.cli("approval", "show", str(asked["id"]), "--json", token=alice).out)
        assert (shown["state"], shown["answered_by"], shown["reason"]) == (
            "denied",
            "service:bob",
            "not today",
        )
        assert ("approval.denied", "service:bob") in audit(s, asked["id"])

    def test_unanswered_is_denied_at_the_timeout(self, tenant_a, tmp_path):
        """approval_timeout_seconds = 3: nobody answers, the server denies; the job ends with
        False; the timeout is audited by the server; a late approve is refused."""
        s, alice, bob = tenant_a(gpu(approval_timeout_seconds=3))
        job = submit(s, alice, tmp_path)
        asked = pending(s, bob, job)
        code, out = ended(s, bob, job)
        assert (code, "approved: False" in out) == (3, True), out
        late = s.cli("approval", "approve", str(asked["id"]), token=bob)
        assert late.code != 0 and "timed_out" in late.err, late.err
        assert audit(s, asked["id"]) == sorted(
            [("approval.requested", f"job:{job}"), ("approval.timed_out", "service:berth")]
        )


# Leases outlive a server restart (the worker reconnects well within these).
PATIENT = {"executor": {"unreachable_seconds": 20.0, "evict_seconds": 40.0}}


def overdue_in_db(db_url: str, approval: int) -> bool:
    async def ask() -> bool:
        conn = await asyncpg.connect(db_url)
        try:
            return bool(
                await conn.fetchval(
                    "SELECT deadline < now() FROM approvals WHERE id = $1", approval
                )
            )
        finally:
            await conn.close()

    return asyncio.run(ask())


class TestServerRestart:
    def test_a_request_outlives_a_restart_and_is_answered_after_it(self, tenant_a, tmp_path):
        """kill -9 of the server while the job waits, a restart: the request is still pending,
        bob approves, the job goes on with True."""
        s, alice, bob = tenant_a(merge(PATIENT, gpu()))
        job = submit(s, alice, tmp_path)
        asked = pending(s, bob, job)
        s.kill(signal.SIGKILL)
        s.start()
        again = json.loads(s.cli("approval", "show", str(asked["id"]), "--json", token=bob).out)
        assert again["state"] == "pending"
        assert s.cli("approval", "approve", str(asked["id"]), token=bob).code == 0
        code, out = ended(s, bob, job)
        assert (code, "approved: True" in out) == (0, True), out

    def test_a_deadline_that_passed_while_no_server_ran_is_enforced(
        self, tenant_a, tmp_path, sync_db_url
    ):
        """The deadline passes while the server is down; the restarted server denies it."""
        s, alice, bob = tenant_a(merge(PATIENT, gpu(approval_timeout_seconds=3)))
        job = submit(s, alice, tmp_path)
        asked = pending(s, bob, job)
        s.kill(signal.SIGKILL)
        wait_for(lambda: overdue_in_db(sync_db_url, asked["id"]), 30, "the deadline to pass")
        s.start()
        code, out = ended(s, bob, job)
        assert (code, "approved: False" in out) == (3, True), out
        assert ("approval.timed_out", "service:berth") in audit(s, asked["id"])


@pytest.fixture
def stack(server_factory, tmp_path) -> Iterator[Stack]:
    """berth in proxy mode behind nginx and the auth stub (tests/e2e/test_proxy_nginx.py's)."""
    server = server_factory(CONFIG, builtin_worker=False)
    front = ProxyFront(tmp_path / "nginx", f"127.0.0.1:{server.port}").start()
    yield Stack(server, front)
    front.stop()


class TestThroughNginx:
    def test_asked_and_answered_through_the_proxy(self, stack, worker_factory):
        """auth = "proxy" behind nginx, the worker attached through it: ci-pipeline's job asks
        with its relayed `berth`; ci-pipeline (its creator) is refused, carol of another tenant
        sees nothing (404), bob of its tenant approves; the job goes on; all of it audited."""
        via = Front(stack.server, stack.front.url)
        worker_factory(via, WORKER_SECRET, "gpu", "--name", "gpu-w1", name="gpu-w1")
        wait_for(
            lambda: any(
                x["name"] == "gpu-w1" and x["attached"]
                for x in stack.call(ALICE, "GET", "/api/v1/workers").json()
            ),
            30,
            "gpu-w1 attached through nginx",
        )
        script = "berth approval request 'deploy via nginx'; echo exit=$?"
        job = stack.submit(CI, {"command": ["sh", "-c", script], "pool": "gpu"})["id"]

        def asked() -> dict | None:
            r = stack.call(BOB, "GET", "/api/v1/approvals", params={"job": job})
            assert r.status_code == 200, r.text
            return next(iter(r.json()), None)

        approval = wait_for(asked, 60, "the job to ask")["id"]
        path = f"/api/v1/approvals/{approval}/approve"
        own = stack.call(CI, "POST", path, json={})
        assert own.status_code == 403 and "four-eyes" in own.json()["error"], own.text
        assert stack.call(CAROL, "POST", path, json={}).status_code == 404
        yes = stack.call(BOB, "POST", path, json={"reason": "ok"})
        assert (yes.status_code, yes.json()["answered_by"]) == (200, "human:bob"), yes.text
        done = wait_for(
            lambda: (j := stack.job(job))["state"] in {"succeeded", "failed"} and j,
            60,
            "the job to end",
        )
        assert done["state"] == "succeeded", done
        logs = stack.call(ALICE, "GET", f"/api/v1/jobs/{job}/logs").json()
        assert "approved\nexit=0" in "".join(c["data"] for c in logs["chunks"])
        audit = stack.audit()
        for who, action in (
            (f"job:{job}", "approval.requested"),
            ("service:ci-pipeline", "approval.refused"),
            ("human:bob", "approval.approved"),
        ):
            assert (who, action, str(approval)) in audit
