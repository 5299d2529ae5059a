"""A worker's identity is its credential (SPEC section 2), end to end with real processes.

Revoking a worker's credential moves its work at once without running it twice, and each
server's built-in worker is an identity of its own, kept in that server's home.
"""

import json

from tests import marks
from tests.procs import wait_for

# The silence window is 90 s, as by default: anything quicker than it is the revocation's doing.
SLOW_SILENCE = {
    "executor": {"unreachable_seconds": 30.0, "evict_seconds": 60.0},
    "pools": {"gpu": {"slots": {"default": 1}}},
}


def job(s, job_id: int) -> dict:
    return s.api("GET", f"/api/v1/jobs/{job_id}").json()


def workers(s) -> dict[str, dict]:
    return {w["name"]: w for w in json.loads(s.cli("worker", "list", "--json").out)}


class TestRevocation:
    def test_a_revoked_worker_gives_its_job_back_at_once(
        self, server_factory, worker_factory, shared_dir
    ):
        """Revoking gpu1 while its job runs: gpu1 kills the job and exits; the job runs again on
        gpu2 within 20 heartbeats (the silence window is 90 s), and never two copies at once."""
        s = server_factory(SLOW_SILENCE, builtin_worker=False)
        w1 = worker_factory(s, s.worker_token("gpu1"), "gpu", name="1")
        wait_for(lambda: "gpu1" in workers(s), 20, "gpu1 attached")
        r = s.api(
            "POST", "/api/v1/jobs", json={"command": marks.script(shared_dir, 30), "pool": "gpu"}
        )
        job_id = int(r.json()["id"])
        wait_for(lambda: job(s, job_id)["state"] == "running", 20, "the job running on gpu1")
        wait_for(lambda: (shared_dir / f"{job_id}.1").exists(), 20, "the first copy's marks")
        worker_factory(s, s.worker_token("gpu2"), "gpu", name="2")
        wait_for(lambda: "gpu2" in workers(s), 20, "gpu2 attached")
        assert s.cli("token", "revoke", "gpu1").code == 0
        heartbeat = 0.5  # tests.procs.FAST
        moved = wait_for(
            lambda: (j := job(s, job_id))["attempt"] == 2 and j["state"] == "running" and j,
            20 * heartbeat,
            "the job running again after the revocation",
        )
        assert moved["worker"] == "gpu2"
        gone = w1.wait(timeout=30)
        assert gone.code != 0 and "revoked" in gone.err
        wait_for(lambda: (shared_dir / f"{job_id}.2").exists(), 20, "the second copy's marks")
        assert marks.overlaps(shared_dir) == []
        first = marks.copies(shared_dir)[job_id][0]
        assert first.epoch == 1 and not first.ended  # killed, not finished
        actions = [(e["action"], e["target"]) for e in s.api("GET", "/api/v1/audit").json()]
        assert ("token.revoked", "gpu1") in actions and ("worker.left", "gpu1") in actions


class TestTokenModeTakeover:
    def test_a_revoked_workers_name_is_not_minted_again_while_it_holds_leases(
        self, server_factory, worker_factory
    ):
        """gpu1 (fleet-wide) runs tenant b's job and goes silent; its token is revoked; neither
        an operator of tenant a nor an admin gets a token named gpu1 while the lease is live,
        so no credential can attach as gpu1 and take b's job."""
        import signal

        s = server_factory(SLOW_SILENCE, builtin_worker=False)
        w1 = worker_factory(s, s.worker_token("gpu1"), "gpu", name="1")
        wait_for(lambda: "gpu1" in workers(s), 20, "gpu1 attached")
        r = s.api(
            "POST",
            "/api/v1/jobs",
            json={"command": ["sleep", "60"], "pool": "gpu", "tenant": "b"},
        )
        job_id = int(r.json()["id"])
        wait_for(lambda: job(s, job_id)["state"] == "running", 20, "b's job running on gpu1")
        assert w1.proc is not None
        w1.proc.send_signal(signal.SIGSTOP)  # it cannot give anything back now
        try:
            assert s.cli("token", "revoke", "gpu1").code == 0
            operator = s.cli("token", "create", "op-a", "--kind", "operator", "--tenant", "a")
            assert operator.code == 0, operator.err
            for token in (operator.out.strip(), None):
                again = s.cli(
                    "token", "create", "gpu1", "--kind", "worker", "--tenant", "a", token=token
                )
                assert again.code != 0 and "still holds leases" in again.err, again
            shown = job(s, job_id)
            assert shown["state"] == "running" and shown["worker"] == "gpu1"
        finally:
            w1.proc.send_signal(signal.SIGCONT)


class TestBuiltinWorkers:
    def test_two_servers_on_one_home_keep_both_builtin_workers(self, server_factory):
        """Two servers on one home (and one database) each run a built-in worker of its own;
        a restart keeps the name, and neither knocks the other off."""
        a = server_factory(name="home")
        b = server_factory(name="home")
        assert a.home == b.home

        def builtins() -> dict[str, dict]:
            return {n: w for n, w in workers(a).items() if w["pool"] == "serve"}

        both = wait_for(
            lambda: (
                (found := builtins())
                and len(found) == 2
                and all(w["state"] == "active" for w in found.values())
                and found
            ),
            30,
            "two built-in workers attached",
        )
        assert all(name.startswith("serve-") for name in both)
        b.stop()
        b.start()
        again = wait_for(
            lambda: (
                (found := builtins())
                and set(found) == set(both)
                and all(w["seen_seconds_ago"] < 5 for w in found.values())
                and found
            ),
            30,
            "the same two built-in workers after a restart",
        )
        assert set(again) == set(both)
        for s in (a, b):
            r = s.cli("job", "submit", "--wait", "--pool", "serve", "--", "echo", "hello")
            assert r.code == 0 and r.out.strip() == "hello", r.err
