"""The worker channel under process faults: a frozen server (SIGSTOP), reports resent across a
server kill -9. Real `berth serve` and `berth worker` processes. A worker that stops reading,
stale epochs and bad frames are tested in process (tests/integration/test_worker_channel.py).
"""

import signal
import time

import psutil

from tests import marks
from tests.procs import wait_for

HEARTBEAT = 0.5
FROZEN = {
    "executor": {
        "heartbeat_seconds": HEARTBEAT,
        "unreachable_seconds": 3.0,
        "evict_seconds": 6.0,
        "kill_grace_seconds": 0.5,
    },
    "pools": {"gpu": {"slots": {"default": 1}}},
}
WINDOW = 3.0 + 6.0  # unreachable + evict: a silent worker's leases expire after this


def job_state(s, j: int) -> dict:
    return s.api("GET", f"/api/v1/jobs/{j}").json()


def attached(s, name: str) -> bool:
    return any(w["name"] == name and w["attached"] for w in s.api("GET", "/api/v1/workers").json())


def copies_alive(job: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("BERTH_JOB_ID") == str(job) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


class TestFrozenServer:
    def test_self_stopped_copy_is_given_back_and_runs_again(
        self, server_factory, worker_factory, shared_dir
    ):
        """The only server freezes past the silence window; its worker stops the job itself.
        Resumed, the server hears the copy was given back and the job runs again at once."""
        s = server_factory(FROZEN, builtin_worker=False)
        worker_factory(s, s.worker_token("w1"), "gpu", name="w1")
        wait_for(lambda: attached(s, "w1"), 20, "w1 attached")
        long, short = marks.script(shared_dir, 120)[2], marks.script(shared_dir, 0.5)[2]
        command = f'if [ "$BERTH_ATTEMPT" = 1 ]; then {long}; else {short}; fi'
        r = s.api("POST", "/api/v1/jobs", json={"command": ["sh", "-c", command], "pool": "gpu"})
        j = r.json()["id"]
        wait_for(lambda: copies_alive(j), 20, "the first copy to run")
        assert s.proc is not None
        s.proc.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            # The worker hears no ack and stops its copy two heartbeats before the window ends.
            wait_for(lambda: not copies_alive(j), WINDOW + 5, "the worker to stop its copy")
            stopped_after = time.monotonic() - frozen_at
            wait_for(lambda: time.monotonic() - frozen_at > WINDOW + 1, WINDOW + 2, "the window")
        finally:
            s.proc.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        worker_factory(s, s.worker_token("w2"), "gpu", name="w2")
        done = wait_for(
            lambda: (x := job_state(s, j))["state"] == "succeeded" and x, 30, "the job to succeed"
        )
        took = time.monotonic() - resumed
        assert stopped_after < WINDOW  # before the lease could expire
        assert took < 10 * HEARTBEAT, f"took {took:.1f}s after the resume"  # window is 18 beats
        assert done["attempt"] == 2
        runs = marks.copies(shared_dir)[j]
        assert len(runs) == 2 and not runs[0].ended and runs[1].ended
        assert marks.overlaps(shared_dir) == []


class TestReportsAreResent:
    def test_output_survives_a_server_kill_whole_and_once(self, server_factory, worker_factory):
        """kill -9 of the server while a job prints: after the restart its output is whole, in
        order, and no line is kept twice (reports are resent until received, and kept once)."""
        s = server_factory({"pools": {"gpu": {"slots": {"default": 1}}}}, builtin_worker=False)
        worker_factory(s, s.worker_token("w1"), "gpu", name="w1")
        wait_for(lambda: attached(s, "w1"), 20, "w1 attached")
        script = "for i in $(seq 1 150); do echo line-$i; sleep 0.02; done"
        r = s.api("POST", "/api/v1/jobs", json={"command": ["sh", "-c", script], "pool": "gpu"})
        j = r.json()["id"]

        def lines() -> list[str]:
            got = s.api("GET", f"/api/v1/jobs/{j}/logs").json()["chunks"]
            return "".join(c["data"] for c in got).splitlines()

        wait_for(lambda: len(lines()) >= 20, 20, "some output")
        s.kill(signal.SIGKILL)
        s.start()
        shown = wait_for(
            lambda: (x := job_state(s, j))["state"] == "succeeded" and x, 60, "the job to end"
        )
        assert shown["attempt"] == 1  # the worker kept its lease across the restart
        assert lines() == [f"line-{i}" for i in range(1, 151)]
