"""Approvals end to end (issue 18): a server, a remote worker, and jobs that ask with the
runtime (`request_approval`) or their own `berth approval request`, through the relay; members
answer with the real CLI. Tenant a has two members: alice (who submits) and bob."""

import asyncio
import json
import signal
import textwrap

import asyncpg
import pytest

from tests.e2e.test_job_io import remote
from tests.procs import merge, wait_for

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
