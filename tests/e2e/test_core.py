"""The core, end to end: `berth serve`, `berth worker` and `berth job` as real processes."""

import json
import time

import psutil

from tests.procs import wait_for

GPU = {"pools": {"gpu": {"slots": {"default": 2}}}}


class TestSubmitWait:
    def test_echo_prints_and_exits_zero(self, server_factory):
        """`submit --wait -- echo hello` prints hello and exits 0."""
        s = server_factory()
        r = s.cli("job", "submit", "--wait", "--", "echo", "hello")
        assert (r.code, r.out) == (0, "hello\n"), r.err

    def test_exit_code_is_the_jobs(self, server_factory):
        """A job that exits 3 makes `submit --wait` exit 3."""
        s = server_factory()
        r = s.cli("job", "submit", "--wait", "--", "sh", "-c", "echo oops >&2; exit 3")
        assert r.code == 3
        assert "oops" in r.err

    def test_submit_prints_the_id_alone(self, server_factory):
        """Without --wait, stdout is the new job's id and nothing else."""
        s = server_factory()
        r = s.cli("job", "submit", "--", "true")
        assert r.code == 0 and r.out.strip().isdigit()
        w = s.cli("job", "wait", r.out.strip())
        assert w.code == 0
        shown = json.loads(s.cli("job", "show", r.out.strip(), "--json").out)
        for key in (
            "id",
            "state",
            "attempt",
            "exit_code",
            "worker",
            "tenant",
            "created_by",
            "waiting_for",
        ):
            assert key in shown
        assert shown["state"] == "succeeded" and shown["created_by"] == "human:admin"


class TestPlacement:
    def test_labels_pool_and_waiting_reason(self, server_factory, worker_factory):
        """A gpu worker with label cuda runs a cuda job; a tpu job waits and says why."""
        s = server_factory(GPU)
        token = s.worker_token("gpu1")
        w = worker_factory(s, token, "gpu", "--labels", "cuda")
        wait_for(
            lambda: any(
                x["name"] == "gpu1" and x["attached"]
                for x in json.loads(s.cli("worker", "list", "--json").out)
            ),
            20,
            "gpu1 attached",
        )
        r = s.cli(
            "job",
            "submit",
            "--wait",
            "--pool",
            "gpu",
            "--label",
            "cuda",
            "--",
            "sh",
            "-c",
            "echo on $BERTH_JOB_ID",
        )
        assert r.code == 0 and r.out.startswith("on "), r.err
        ran = json.loads(s.cli("job", "list", "--json").out)[0]
        assert ran["worker"] == "gpu1"
        tpu = s.cli("job", "submit", "--pool", "gpu", "--label", "tpu", "--", "true").out.strip()
        shown = wait_for(
            lambda: (x := json.loads(s.cli("job", "show", tpu, "--json").out))["waiting_for"] and x,
            10,
            "the tpu job's reason to wait",
        )
        assert shown["state"] == "queued"
        assert "tpu" in shown["waiting_for"] and "no attached worker" in shown["waiting_for"]
        text = s.cli("job", "show", tpu).out
        assert "waiting for" in text and "tpu" in text
        workers = {x["name"]: x for x in json.loads(s.cli("worker", "list", "--json").out)}
        builtin = [n for n in workers if n != "gpu1"]
        assert len(workers) == 2 and builtin[0].startswith("serve-")  # each server's own
        for x in workers.values():
            for key in ("name", "pool", "state", "labels", "seen_seconds_ago", "no_lease"):
                assert key in x
        assert workers["gpu1"]["labels"] == ["cuda"] and workers["gpu1"]["state"] == "active"
        assert workers["gpu1"]["no_lease"] == "nothing"  # the waiting tpu job is not for it
        table = s.cli("worker", "list").out
        for column in ("NAME", "POOL", "STATE", "SEEN", "LOAD", "MEM", "DISK", "SLOTS", "NO LEASE"):
            assert column in table
        assert w.proc is not None and w.proc.poll() is None

    def test_prefer_runs_without_the_label(self, server_factory):
        """device_policy prefer: with no worker carrying the label, any fitting worker runs it."""
        s = server_factory()
        r = s.cli(
            "job", "submit", "--wait", "--label", "cuda", "--device-policy", "prefer", "--", "true"
        )
        assert r.code == 0, r.err


class TestRefusals:
    def test_revoked_token_makes_the_worker_exit(self, server_factory, worker_factory):
        """Revoking a worker's token makes it exit non-zero with the reason, within a heartbeat."""
        s = server_factory(GPU)
        w = worker_factory(s, s.worker_token("gpu1"), "gpu")
        wait_for(
            lambda: any(
                x["name"] == "gpu1" and x["attached"]
                for x in json.loads(s.cli("worker", "list", "--json").out)
            ),
            20,
            "attached",
        )
        started = time.monotonic()
        assert s.cli("token", "revoke", "gpu1").code == 0
        r = w.wait(timeout=10)
        assert time.monotonic() - started < 0.5 + 2.0  # one heartbeat, plus process exit
        assert r.code != 0 and "revoked" in r.err

    def test_unknown_pool_is_refused_with_the_reason(self, server_factory, worker_factory):
        """A worker naming a pool the server lacks is refused and says so."""
        s = server_factory()
        r = worker_factory(s, s.worker_token("w1"), "nosuchpool").wait(timeout=20)
        assert r.code != 0 and "unknown pool 'nosuchpool'" in r.err

    def test_bad_token_is_refused(self, server_factory, worker_factory):
        """A worker with a bad token is refused and says so."""
        s = server_factory()
        r = worker_factory(s, "brt_" + "x" * 43, "serve").wait(timeout=20)
        assert r.code != 0 and "unknown token" in r.err


class TestCancel:
    def test_cancel_leaves_no_process_behind(self, server_factory):
        """Cancelling `sh -c 'sleep 300 & sleep 300'` kills both sleeps."""
        s = server_factory()
        job = s.cli("job", "submit", "--", "sh", "-c", "sleep 300 & sleep 300").out.strip()

        def sleeps() -> list[psutil.Process]:
            found = []
            for p in psutil.process_iter(["name"]):
                try:
                    if p.info["name"] == "sleep" and p.environ().get("BERTH_JOB_ID") == job:
                        found.append(p)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            return found

        assert len(wait_for(lambda: len(sleeps()) == 2 and sleeps(), 20, "two sleeps")) == 2
        r = s.cli("job", "cancel", job)
        assert r.code == 0 and "cancelled" in r.out
        wait_for(lambda: not sleeps(), 10, "the sleeps to die")
        assert json.loads(s.cli("job", "show", job, "--json").out)["state"] == "cancelled"
        assert s.cli("job", "wait", job).code == 130


class TestManyJobs:
    def test_200_jobs_over_3_workers_exactly_once_within_slots(
        self, server_factory, worker_factory, shared_dir
    ):
        """200 jobs at once over 3 workers all finish, each once, never over a worker's slots."""
        s = server_factory({"pools": {"gpu": {"slots": {"default": 3}}}}, builtin_worker=False)
        marks = shared_dir
        for i in range(3):
            worker_factory(s, s.worker_token(f"w{i}"), "gpu", name=f"w{i}")
        script = (
            'echo "start $(date +%s.%N)" >> "$M/$BERTH_JOB_ID.$W"; sleep 0.02; '
            'echo "end $(date +%s.%N)" >> "$M/$BERTH_JOB_ID.$W"'
        )
        jobs = [
            {
                "command": ["sh", "-c", script.replace("$M", str(marks)).replace("$W", "w")],
                "pool": "gpu",
            }
            for _ in range(200)
        ]
        r = s.api("POST", "/api/v1/jobs", json=jobs)
        assert r.status_code == 201, r.text
        ids = r.json()["ids"]
        assert len(ids) == 200

        def done() -> bool:
            listed = s.api("GET", "/api/v1/jobs", params={"limit": 500}).json()
            return all(j["state"] == "succeeded" for j in listed) and len(listed) == 200

        wait_for(done, 120, "all 200 jobs to succeed", every=0.5)
        listed = s.api("GET", "/api/v1/jobs", params={"limit": 500}).json()
        assert all(j["attempt"] == 1 for j in listed)
        by_worker: dict[str, list[tuple[float, float]]] = {}
        for j in listed:
            lines = (marks / f"{j['id']}.w").read_text().split()
            assert lines.count("start") == 1, f"job {j['id']} ran {lines.count('start')} times"
            start, end = float(lines[1]), float(lines[3])
            by_worker.setdefault(j["worker"], []).append((start, end))
        assert set(by_worker) == {"w0", "w1", "w2"}
        for worker, spans in by_worker.items():
            events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
            running = peak = 0
            for _, delta in events:
                running += delta
                peak = max(peak, running)
            assert peak <= 3, f"{worker} ran {peak} jobs at once with 3 slots"
