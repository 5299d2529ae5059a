"""`berth job exec` / `berth job shell` with real processes: a server, a root worker with
per-job uids and namespaces, the CLI (on a PTY where a terminal is needed)."""

import textwrap

import pytest

from tests.e2e.test_trust import attached, submit
from tests.procs import wait_for

UID = 61760
POOL = {"pools": {"gpu": {"slots": {"default": 2}, "exec": "member"}}}
# The job writes mine.txt and a file in its private /tmp, says so, and waits.
JOB = textwrap.dedent(
    """
    echo hello-from-the-job > mine.txt
    echo private > /tmp/only-the-job-sees-me
    echo ready
    exec sleep 600
    """
)


def running(s, job_id: int) -> bool:
    shown = s.api("GET", f"/api/v1/jobs/{job_id}").json()
    if shown["state"] != "running":
        return False
    logs = s.api("GET", f"/api/v1/jobs/{job_id}/logs").json()
    return "ready" in "".join(c["data"] for c in logs["chunks"])


@pytest.fixture
def setup(server_factory, worker_factory):
    s = server_factory(POOL, builtin_worker=False)
    worker_factory(s, s.worker_token("gpu1"), "gpu", "--uid-range", f"{UID}-{UID + 3}")
    wait_for(lambda: attached(s, "gpu1"), 30, "gpu1 attached")
    job = submit(s, {"command": ["sh", "-c", JOB], "pool": "gpu"})
    wait_for(lambda: running(s, job), 60, f"job {job} running")
    return s, job


class TestExec:
    def test_exec_beside_a_running_job(self, setup):
        """The exec'd command runs in the job's folder, as its uid, in its /tmp; exit codes
        come back."""
        s, job = setup
        r = s.cli("job", "exec", str(job), "--", "cat", "mine.txt")
        assert r.code == 0, r.err
        assert r.out == "hello-from-the-job\n"
        r = s.cli("job", "exec", str(job), "--", "sh", "-c", "id -u; cat /tmp/only-the-job-sees-me")
        assert r.code == 0, r.err
        uid, private = r.out.split()
        assert UID <= int(uid) <= UID + 3
        assert private == "private"
        r = s.cli("job", "exec", str(job), "--", "sh", "-c", "echo oops >&2; exit 7")
        assert r.code == 7
        assert "oops" in r.err
