"""Smoke test of berth's benchmark scenarios (bench/berth): tiny sizes, no timing asserted.

Each scenario runs as the suite runs it, a subprocess printing one JSON object as its last
stdout line, against the test run's Postgres. This keeps `bench/` from rotting: a protocol or
API change that breaks the simulated workers or the scenario scripts fails here.
"""

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

    for scenario in ("dispatch", "drain", "fleet_20"):
        asyncio.run(
            pg.admin(
                pg_admin_url,
                f'DROP DATABASE IF EXISTS "bench_berth_{scenario}{suffix}" WITH (FORCE)',
            )
        )


def run(env: dict[str, str], *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--timeout", "40", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
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
