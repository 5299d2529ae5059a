"""Jobs get the resources they ask for, with real processes (SPEC section 4, "Resources").

- CPUs: two `--cpus 2` jobs on a worker declared `--cpus 3` run one after the other, and (on
  the cgroup path: this machine and CI run as root with cgroup v1) each job's CPU quota is
  twice its period.
- memory: a job past its `--memory 256M` is killed and reported so, while a neighbour on the
  same worker finishes; on the rlimit path (a worker started as another user) its allocation
  fails with ENOMEM and the job fails saying so.
- GPUs: a fake NVML (a `pynvml` module first on the worker's PYTHONPATH, the discovery
  boundary) answers two GPUs: two `--gpus 1` jobs see different CUDA_VISIBLE_DEVICES, a third
  waits saying why.
- quotas: with two servers on one database, a tenant at `max_running=2` gets no third lease
  while another tenant's jobs flow.

Jobs wait on files the test creates (conditions, never sleeps).
"""

import json
import os
import textwrap
from pathlib import Path

from tests.e2e.test_trust import attached, finished, output, submit
from tests.procs import wait_for

POOL = {"pools": {"res": {"slots": {"default": 4}}}}
NOBODY = 65534
FAKE_NVML = textwrap.dedent(
    """
    # A stand-in for nvidia-ml-py's pynvml: two GPUs, as a driver would answer.
    class NVMLError(Exception):
        pass

    class _Memory:
        total = 40 * 1024**3

    class _Busy:
        gpu = 7

    def nvmlInit(): pass
    def nvmlShutdown(): pass
    def nvmlDeviceGetCount(): return 2
    def nvmlDeviceGetHandleByIndex(i): return i
    def nvmlDeviceGetName(h): return f"Fake A100 {h}"
    def nvmlDeviceGetMemoryInfo(h): return _Memory()
    def nvmlDeviceGetUtilizationRates(h): return _Busy()
    """
)
HOG = "python3 -c \"b = [b'x' * (16 << 20) for _ in range(64)]; print('survived')\""


def wait_file(path: Path) -> str:
    return f'while [ ! -e "{path}" ]; do sleep 0.1; done'


def state(s, job: int) -> dict:
    return s.api("GET", f"/api/v1/jobs/{job}").json()


def running(s, job: int) -> bool:
    return state(s, job)["state"] == "running"


def worker_row(s, name: str) -> dict:
    return next(w for w in s.api("GET", "/api/v1/workers").json() if w["name"] == name)


def started_log(w) -> str:
    """The worker's log so far (it is stopped first)."""
    w.stop()
    return w.proc.stderr.read() if w.proc.stderr else ""


class TestCpusAndMemoryByCgroup:
    def test_cpu_quota_one_after_the_other_and_a_memory_kill(
        self, server_factory, worker_factory, shared_dir
    ):
        s = server_factory(POOL, builtin_worker=False)
        w = worker_factory(s, s.worker_token("w1"), "res", "--cpus", "3", "--memory", "1G")
        wait_for(lambda: attached(s, "w1"), 30, "w1 attached")
        assert worker_row(s, "w1")["capacity"] == {"cpus": 3.0, "memory_mb": 1024, "gpus": 0}
        go = shared_dir / "go-cpu"
        quota = (
            'p=$(grep -E "^[0-9]+:cpu:" /proc/self/cgroup | cut -d: -f3); '
            'echo "quota=$(cat /sys/fs/cgroup/cpu$p/cpu.cfs_quota_us) '
            'period=$(cat /sys/fs/cgroup/cpu$p/cpu.cfs_period_us)"; ' + wait_file(go)
        )
        body = {"command": ["sh", "-c", quota], "pool": "res", "cpus": 2}
        first, second = submit(s, body), submit(s, body)
        wait_for(lambda: running(s, first), 30, "the first 2-CPU job running")
        said = wait_for(lambda: state(s, second)["waiting_for"], 30, "the second's reason")
        assert said == "no worker of pool res has 2 free CPUs"
        assert worker_row(s, "w1")["no_lease"] == "cpus_reserved"
        go.touch()
        a, b = finished(s, first), finished(s, second)
        assert a["state"] == b["state"] == "succeeded"
        assert b["started_at"] >= a["finished_at"]  # one after the other
        for job in (first, second):
            text = output(s, job).decode()
            fields = dict(x.split("=") for x in text.split())
            assert int(fields["quota"]) == 2 * int(fields["period"]), text

        go = shared_dir / "go-mem"
        neighbour = submit(
            s,
            {
                "command": ["sh", "-c", wait_file(go) + "; echo neighbour done"],
                "pool": "res",
                "memory_mb": 128,
            },
        )
        wait_for(lambda: running(s, neighbour), 30, "the neighbour running")
        hog = submit(s, {"command": ["sh", "-c", HOG], "pool": "res", "memory_mb": 256})
        ended = finished(s, hog)
        assert ended["state"] == "failed"
        assert ended["error"] == "killed: over its 256 MiB memory limit"
        assert b"survived" not in output(s, hog)
        assert running(s, neighbour)
        go.touch()
        assert finished(s, neighbour)["state"] == "succeeded"
        assert output(s, neighbour) == b"neighbour done\n"
        assert w.proc is not None and w.proc.poll() is None  # the worker is untouched
        assert "limits each job by cgroup v1" in started_log(w)


class TestMemoryByRlimit:
    def test_a_worker_that_is_not_root(self, server_factory, worker_factory, shared_dir):
        """As another user the worker makes no cgroup: RLIMIT_AS makes the hog's allocation
        fail with ENOMEM, and the job fails saying so."""
        s = server_factory(POOL, builtin_worker=False)
        home = shared_dir / "worker-w"  # where worker_factory puts it
        home.mkdir()
        os.chown(home, NOBODY, NOBODY)
        # nobody, keeping only the right to read and search folders (the test's interpreter
        # lives under /root): it may write nothing of root's, so it makes no cgroup.
        as_nobody = (
            "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", "--",
        )  # fmt: skip
        w = worker_factory(
            s, s.worker_token("w2"), "res", "--memory", "1G", prefix=as_nobody,
            under=shared_dir,
        )  # fmt: skip
        wait_for(lambda: attached(s, "w2"), 30, "w2 attached")
        hog = submit(s, {"command": ["sh", "-c", HOG], "pool": "res", "memory_mb": 256})
        ended = finished(s, hog)
        assert ended["state"] == "failed"
        assert "limited to 256 MiB by RLIMIT_AS" in ended["error"]
        assert "ENOMEM" in ended["error"]
        assert b"MemoryError" in output(s, hog)
        assert "limits each job by rlimits" in started_log(w)


class TestGpus:
    def test_two_jobs_two_gpus_and_a_third_waits(
        self, server_factory, worker_factory, shared_dir, tmp_path
    ):
        fake = tmp_path / "fake-nvml"
        fake.mkdir()
        (fake / "pynvml.py").write_text(FAKE_NVML)
        s = server_factory(POOL, builtin_worker=False)
        w = worker_factory(
            s, s.worker_token("g1"), "res",
            env={"PYTHONPATH": f"{fake}:{os.environ.get('PYTHONPATH', '')}".rstrip(":")},
        )  # fmt: skip
        wait_for(lambda: attached(s, "g1"), 30, "g1 attached")
        row = worker_row(s, "g1")
        assert row["capacity"]["gpus"] == 2
        assert [(d["index"], d["name"], d["utilization"]) for d in row["devices"]] == [
            (0, "Fake A100 0", 7),
            (1, "Fake A100 1", 7),
        ]
        go = shared_dir / "go-gpu"
        body = {
            "command": ["sh", "-c", 'echo "cuda=$CUDA_VISIBLE_DEVICES"; ' + wait_file(go)],
            "pool": "res",
            "gpus": 1,
        }
        jobs = [submit(s, body) for _ in range(3)]
        wait_for(lambda: sum(running(s, j) for j in jobs) == 2, 30, "two GPU jobs running")
        third = next(j for j in jobs if not running(s, j))
        said = wait_for(lambda: state(s, third)["waiting_for"], 30, "the third's reason")
        assert said == "no worker of pool res has 1 free GPU"
        table = s.cli("worker", "list").out
        assert "0:Fake A100 0 7%" in table and "0/2 gpu" in table
        two = [j for j in jobs if j != third]
        seen = wait_for(
            lambda: all(output(s, j) for j in two) and {output(s, j) for j in two},
            30,
            "their output",
        )
        assert seen == {b"cuda=0\n", b"cuda=1\n"}
        go.touch()
        assert all(finished(s, j)["state"] == "succeeded" for j in jobs)
        assert output(s, third) in (b"cuda=0\n", b"cuda=1\n")
        log = started_log(w)
        assert "2 GPUs (0: Fake A100 0, 1: Fake A100 1)" in log

    def test_bad_sizes_are_one_line(self, server_factory):
        """The CLI refuses a bad --memory, --cpus or --gpus in one line, without a traceback."""
        s = server_factory(POOL, builtin_worker=False)
        for argv, says in (
            (("job", "submit", "--memory", "lots", "--", "true"), "--memory 'lots' is not a size"),
            (("job", "submit", "--cpus", "-1", "--", "true"), "--cpus must be a finite number"),
            (("worker", "--pool", "res", "--gpus", "-2"), "--gpus must be a whole number"),
        ):
            r = s.cli(*argv)
            assert r.code != 0 and says in r.err, r.err
            assert len(r.err.strip().splitlines()) == 1, r.err
        r = s.api("POST", "/api/v1/jobs", json={"command": ["true"], "memory_mb": -5})
        assert r.status_code == 400 and "memory_mb" in r.json()["error"]


class TestQuotaOnTwoServers:
    def test_max_running_holds_across_servers(self, server_factory, worker_factory, shared_dir):
        one = server_factory(POOL, builtin_worker=False, name="one")
        two = server_factory(POOL, builtin_worker=False, name="two")
        r = one.cli("limits", "set", "tenants.a.max_running=2", "--reason", "two at a time")
        assert r.code == 0, r.err
        worker_factory(one, one.worker_token("q1"), "res", name="q1")
        worker_factory(two, two.worker_token("q2"), "res", name="q2")
        wait_for(lambda: attached(one, "q1") and attached(one, "q2"), 30, "both attached")
        go = shared_dir / "go-quota"
        a_body = {"command": ["sh", "-c", wait_file(go)], "pool": "res", "tenant": "a"}
        a_jobs = [submit(one, a_body) for _ in range(2)] + [submit(two, a_body) for _ in range(2)]
        b_jobs = [
            submit(two, {"command": ["true"], "pool": "res", "tenant": "b"}) for _ in range(4)
        ]
        assert all(finished(one, j)["state"] == "succeeded" for j in b_jobs)  # b flows
        states = [state(one, j)["state"] for j in a_jobs]
        assert states.count("running") + states.count("leased") == 2, states
        waiting = [j for j in a_jobs if state(one, j)["state"] == "queued"]
        assert len(waiting) == 2
        said = state(two, waiting[0])["waiting_for"]
        assert said == "tenant a runs 2 jobs, its quota tenants.a.max_running = 2"
        go.touch()
        assert all(finished(one, j)["state"] == "succeeded" for j in a_jobs)
        shown = json.loads(one.cli("limits", "list", "--json").out)
        assert [x["key"] for x in shown] == ["tenants.a.max_running"]
