"""Smoke test of berth's benchmark scenarios (bench/berth): tiny sizes, no timing asserted.

Each scenario runs as the suite runs it, a subprocess printing one JSON object as its last
stdout line, against the test run's Postgres. This keeps `bench/` from rotting: a protocol or
API change that breaks the simulated workers or the scenario scripts fails here. Every scenario
of berth_bench.py runs here (test_every_scenario_is_smoked keeps it so), and a result carrying
an "error" fails its test.
"""

import ast
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import make_url

from tests import pg

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "berth" / "berth_bench.py"


@pytest.fixture(scope="module")
def bench_env(pg_admin_url):
    """Environment pointing the bench at the tests' Postgres, with its own database names."""
    suffix = f"_t{uuid.uuid4().hex[:8]}"
    # benchlib appends "/<database>" to the DSN: give it the server part of the admin URL
    url = make_url(pg_admin_url)
    assert not url.query, "the bench's DSN takes no query string"
    dsn = url.render_as_string(hide_password=False).rsplit("/", 1)[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BERTH_", "BENCH_"))}
    env.update(BENCH_PG_DSN=dsn, BENCH_DB_SUFFIX=suffix, PYTHONUNBUFFERED="1")
    yield env
    import asyncio

    for scenario in (*SMOKED, "fleet_20"):
        asyncio.run(
            pg.admin(
                pg_admin_url,
                f'DROP DATABASE IF EXISTS "bench_berth_{scenario}{suffix}" WITH (FORCE)',
            )
        )


# Scenarios with a database of their own per run (fleet's name carries its size).
SMOKED = ("dispatch", "dispatch_real", "drain", "submit", "real", "failover")


def run(env: dict[str, str], *args: str, limit: float = 40.0) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--timeout", str(limit), *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=limit + 20,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"no output; stderr: {proc.stderr[-2000:]}"
    result = json.loads(lines[-1])
    assert "error" not in result, (result, proc.stderr[-2000:])
    assert proc.returncode == 0
    return result


def test_drain_finishes_every_job(bench_env):
    r = run(bench_env, "--scenario", "drain", "--jobs", "200", "--workers", "2", "--slots", "16")
    assert r["scenario"] == "drain"
    assert r["n"] == r["expected"] == r["completed"] == 200
    assert r["states"] == {"succeeded": 200}
    assert r["stale"] == 0
    assert r["jobs_per_s"] > 0


def test_dispatch_leases_every_job(bench_env):
    r = run(bench_env, "--scenario", "dispatch", "--seconds", "1", "--rate", "20")
    assert r["n"] == r["expected"] == 20
    assert r["succeeded"] == 20 + 3  # and the warm-up jobs
    assert r["duplicates"] == 0
    assert r["p50_ms"] <= r["p99_ms"]


def test_fleet_acks_heartbeats(bench_env):
    r = run(
        bench_env,
        "--scenario",
        "fleet",
        "--workers",
        "20",
        "--heartbeat",
        "0.5",
        "--window",
        "1.5",
    )
    assert r["attached"] == r["workers"] == 20
    assert r["beats_acked"] > 0
    assert r["ack_p99_ms"] >= r["ack_p50_ms"]


def test_dispatch_real_starts_every_job(bench_env):
    # The jobs run as uids of their own: their stamps must land where such a uid may write.
    r = run(bench_env, "--scenario", "dispatch-real", "--seconds", "1", "--rate", "5")
    assert r["n"] == r["expected"] == 5
    assert r["p50_ms"] <= r["p99_ms"]


def test_submit_counts_single_and_batched_jobs(bench_env):
    r = run(
        bench_env,
        "--scenario",
        "submit",
        "--seconds",
        "1",
        "--concurrency",
        "2",
        "--jobs",
        "400",
        "--batch",
        "100",
    )
    assert r["single_jobs"] > 0 and r["single_errors"] == 0
    assert r["batch_jobs"] == 400 and r["batch_errors"] == 0


def test_real_workers_run_every_job(bench_env):
    r = run(bench_env, "--scenario", "real", "--jobs", "20")
    assert r["n"] == r["completed"] == 20
    assert r["states"] == {"succeeded": 21}  # and the warm-up job


@pytest.mark.timeout(150)
def test_failover_restarts_the_job_on_both_paths(bench_env):
    r = run(bench_env, "--scenario", "failover", limit=100.0)
    assert r["fast_s"] > 0 and r["silent_s"] > 0
    assert r["silent_attempt"] >= 2


def test_every_scenario_is_smoked():
    """A scenario added to berth_bench.py without a smoke test here fails this."""
    # Read, not imported: importing the bench clears BERTH_* from this process's environment.
    tree = ast.parse(SCRIPT.read_text())
    scenarios = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "SCENARIOS" for t in node.targets)
    )
    tests = {name for name in globals() if name.startswith("test_")}
    covered = {
        "dispatch": "test_dispatch_leases_every_job",
        "dispatch-real": "test_dispatch_real_starts_every_job",
        "drain": "test_drain_finishes_every_job",
        "submit": "test_submit_counts_single_and_batched_jobs",
        "real": "test_real_workers_run_every_job",
        "fleet": "test_fleet_acks_heartbeats",
        "failover": "test_failover_restarts_the_job_on_both_paths",
    }
    assert set(scenarios) == set(covered)
    assert set(covered.values()) <= tests


def run_script(pg_admin_url: str, name: str, *args: str) -> dict:
    """A bench/berth script that finds Postgres itself (tests/pg.py), at tiny sizes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BERTH_", "BENCH_"))}
    env.update(BERTH_TEST_DATABASE_URL=pg_admin_url, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "berth" / name), *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.timeout(120)
def test_cas_bench_moves_the_blob_and_runs_the_jobs(pg_admin_url):
    r = run_script(pg_admin_url, "cas_bench.py", "--size-mib", "4", "--runs", "2")
    assert (r["scenario"], r["size_mib"], r["runs"]) == ("cas", 4, 2)
    assert r["upload_gib_s"] > 0 and r["download_gib_s"] > 0
    assert r["job_ms_median_one_input"] > 0 and r["job_ms_median_no_input"] > 0


def test_provision_bench_decides(pg_admin_url):
    r = run_script(
        pg_admin_url, "provision_bench.py", "--jobs", "300", "--pools", "3", "--runs", "2"
    )
    assert (r["jobs"], r["pools"], r["runs"]) == (300, 3, 2)
    assert r["starts_decided"] > 0


def test_exec_bench_measures_sessions(pg_admin_url):
    r = run_script(pg_admin_url, "exec_bench.py", "--sessions", "3")
    assert (r["scenario"], r["sessions"]) == ("exec", 3)
    assert r["command_kib_per_session"] > 0
