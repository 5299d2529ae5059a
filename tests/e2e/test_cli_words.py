"""What the CLI a newcomer meets says: where its server is, and the right words for each case."""

import json
import os
import signal
import subprocess
import sys

from service.core.exits import Exit
from tests.procs import FAST, merge, wait_for


def attached(s, name: str) -> bool:
    return any(w["name"] == name and w["attached"] for w in s.api("GET", "/api/v1/workers").json())


def listed(s, name: str) -> dict:
    return {w["name"]: w for w in json.loads(s.cli("worker", "list", "--json").out)}[name]


def job(s, job_id: int) -> dict:
    return s.api("GET", f"/api/v1/jobs/{job_id}").json()


class TestFindsItsServer:
    def test_the_url_berth_serve_wrote(self, server_factory):
        """Without BERTH_SERVER the CLI uses $BERTH_HOME/server.url; --help shows it, never None."""
        s = server_factory(builtin_worker=False)
        path = s.home / "server.url"
        assert path.read_text().strip() == s.url
        env = s.env(BERTH_TOKEN=s.token)
        del env["BERTH_SERVER"]
        r = subprocess.run(
            [sys.executable, "-m", "service", "job", "list", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode == 0 and json.loads(r.stdout) == [], r.stderr
        usage = subprocess.run(
            [sys.executable, "-m", "service", "job", "list", "--help"],
            env={**env, "COLUMNS": "1000"},  # no wrapping inside the path
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
        assert "None" not in usage
        assert f"here: {s.url}, from {path}" in " ".join(usage.split())
        s.stop()
        assert not path.exists()  # a clean stop takes it away
        r = subprocess.run(
            [sys.executable, "-m", "service", "job", "list"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode == Exit.UNREACHABLE
        assert "http://127.0.0.1:8443 (the default" in r.stderr

    def test_a_file_another_server_rewrote_is_left(self, server_factory):
        """On a clean stop the file is removed only while it still holds this server's URL."""
        s = server_factory(builtin_worker=False)
        path = s.home / "server.url"
        assert path.read_text().strip() == s.url
        path.write_text("http://127.0.0.1:1\n")  # a second server on this home, since
        s.stop()
        assert path.read_text() == "http://127.0.0.1:1\n"

    def test_port_zero_writes_the_bound_port(self, tmp_path, sync_db_url):
        """`--listen 127.0.0.1:0`: the file holds the port it got, and the CLI reaches it there."""
        home = tmp_path / "home"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
        env.update(
            BERTH_HOME=str(home),
            BERTH_DATABASE_URL=sync_db_url,
            BERTH_CONFIG_JSON=json.dumps(merge(FAST, {"pools": {"serve": {"builtin": False}}})),
        )
        home.mkdir()
        with (home / "serve.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "service", "serve", "--listen", "127.0.0.1:0"],
                env=env,
                stdout=log,
                stderr=log,
            )
        try:
            path = home / "server.url"
            wait_for(path.exists, 60, "server.url")
            url = path.read_text().strip()
            assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
            r = subprocess.run(
                [sys.executable, "-m", "service", "status", "--json"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert r.returncode == 0, r.stderr
        finally:
            proc.terminate()
            proc.wait(timeout=30)


class TestRightWords:
    def test_malformed_token(self, server_factory):
        """A BERTH_TOKEN that is not a berth token is named as such; exit 202, one line."""
        s = server_factory(builtin_worker=False)
        for bad in ("not-a-token", "brt_…"):
            r = s.cli("job", "list", token=bad)
            assert r.code == Exit.REFUSED, r.err
            assert r.err == "berth: error: BERTH_TOKEN is not a berth token (brt_…)\n"
        r = s.cli("job", "list", token="brt_" + "q" * 43)
        assert (r.code, r.err) == (Exit.REFUSED, "berth: error: BERTH_TOKEN: unknown token\n")

    def test_enable_of_an_exited_worker_says_offline(self, server_factory, worker_factory):
        """`worker enable` of a worker that stopped prints `offline`, not `active`."""
        s = server_factory(builtin_worker=False)
        w = worker_factory(s, s.worker_token("w1"), "serve", name="a")
        wait_for(lambda: attached(s, "w1"), 30, "attached")
        w.stop()
        wait_for(lambda: not attached(s, "w1"), 30, "detached")
        r = s.cli("worker", "enable", "w1")
        assert (r.code, r.out) == (0, "w1: offline (enabled)\n"), r.err
        out = json.loads(s.cli("worker", "disable", "w1", "--json").out)
        assert (out["state"], out["set"]) == ("offline", "disabled")

    def test_a_revoked_worker_is_not_listed_active(self, server_factory, worker_factory):
        """Once its token is revoked a worker is listed `revoked` at once, then and after."""
        s = server_factory(builtin_worker=False)
        w = worker_factory(s, s.worker_token("w1"), "serve", name="a")
        wait_for(lambda: attached(s, "w1"), 30, "attached")
        assert listed(s, "w1")["state"] == "active"
        assert s.cli("token", "revoke", "w1").code == 0
        assert listed(s, "w1")["state"] == "revoked"
        assert w.wait(timeout=30).code == Exit.REFUSED
        assert listed(s, "w1")["state"] == "revoked"
        row = next(x for x in s.cli("worker", "list").out.splitlines() if x.startswith("w1 "))
        assert row.split()[:3] == ["w1", "serve", "revoked"]

    def test_a_kind_no_pool_has(self, server_factory):
        """`--kind gpuish` says no pool has slots of that kind, naming the kinds pools have.

        A conflict with the pools in force (a limit may add the kind at run time), not bad input.
        """
        s = server_factory({"pools": {"gpu": {"slots": {"agent": 2, "eval": 1}}}})
        r = s.cli("job", "submit", "--kind", "gpuish", "--", "true")
        assert r.code == Exit.CONFLICT
        assert r.err == (
            "berth: error: no pool has slots of kind 'gpuish' "
            "(kinds by pool: gpu: agent, eval; serve: default)\n"
        )

    def test_logs_follow_exits_with_the_jobs_code_and_json(self, server_factory):
        """`job logs -f` of a failed job exits with its code; --json is JSON, with and without -f."""
        s = server_factory()
        r = s.cli("job", "submit", "--wait", "--", "sh", "-c", "echo out; exit 7")
        assert r.code == 7 and r.out == "out\n"
        job_id = s.api("GET", "/api/v1/jobs").json()[0]["id"]
        r = s.cli("job", "logs", str(job_id), "-f")
        assert (r.code, r.out) == (7, "out\n")
        got = json.loads(s.cli("job", "logs", str(job_id), "--json").out)
        assert (got["state"], got["exit_code"]) == ("failed", 7)
        assert [(c["stream"], c["data"]) for c in got["chunks"]] == [("stdout", "out\n")]
        r = s.cli("job", "logs", str(job_id), "-f", "--json")
        lines = [json.loads(x) for x in r.out.splitlines()]
        assert r.code == 7
        assert [(x["stream"], x["data"]) for x in lines[:-1]] == [("stdout", "out\n")]
        assert (lines[-1]["state"], lines[-1]["exit_code"]) == ("failed", 7)


def start_waiting(s, *argv: str) -> tuple[subprocess.Popen[str], int]:
    """Start `berth ARGV` (a --wait or `job wait`); its job id from the line it prints first."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", *argv],
        env=s.env(BERTH_TOKEN=s.token),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    first = proc.stderr.readline()
    assert first.startswith("berth: job ") and "submitted; waiting" in first, first
    return proc, int(first.split()[2])


class TestInterruptedWait:
    def test_a_job_that_cannot_be_placed_goes_on_after_ctrl_c(self, server_factory):
        """--wait names the job on stderr at once; Ctrl-C says it goes on and how to cancel it."""
        s = server_factory()
        proc, job_id = start_waiting(s, "job", "submit", "--wait", "--label", "nope", "--", "true")
        assert job(s, job_id)["state"] == "queued"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == Exit.INTERRUPTED
        assert f"berth job cancel {job_id}" in err and "goes on" in err
        assert job(s, job_id)["state"] == "queued"

    def test_cancel_on_interrupt(self, server_factory):
        """With --cancel-on-interrupt, Ctrl-C cancels the running job and says so."""
        s = server_factory()
        proc, job_id = start_waiting(
            s, "job", "submit", "--wait", "--cancel-on-interrupt", "--", "sleep", "60"
        )
        wait_for(lambda: job(s, job_id)["state"] == "running", 30, "running")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == Exit.INTERRUPTED
        assert f"berth: job {job_id} cancelled" in err
        assert job(s, job_id)["state"] == "cancelled"

    def test_job_wait_interrupted_leaves_the_job(self, server_factory):
        """`job wait ID` interrupted says the same: the job goes on."""
        s = server_factory()
        job_id = int(s.cli("job", "submit", "--", "sleep", "60").out)
        wait_for(lambda: job(s, job_id)["state"] == "running", 30, "running")
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "job", "wait", str(job_id)],
            env=s.env(BERTH_TOKEN=s.token),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: _waiting_on(proc.pid), 30, "job wait to be in its loop")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == Exit.INTERRUPTED and f"berth job cancel {job_id}" in err
        assert job(s, job_id)["state"] == "running"
        assert s.cli("job", "cancel", str(job_id)).code == 0


def _waiting_on(pid: int) -> bool:
    """The process has a connection open to the server: it is past its imports, polling."""
    import psutil

    try:
        return bool(psutil.Process(pid).net_connections(kind="tcp"))
    except psutil.Error:
        return False
