"""GET /metrics on a real server: Prometheus conventions (promtool), the right readers, and
numbers that move with the jobs run and agree between servers."""

import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.procs import Server, wait_for

GPU = {"pools": {"gpu": {"slots": {"default": 2, "big": 1}}}}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(scraped: dict, name: str, **labels: str) -> float:
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


def total(scraped: dict, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in scraped.items() if n == name and want <= set(ls))


def scrape(s: Server, token: str | None = None) -> str:
    r = s.api("GET", "/metrics", token=token)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return r.text


def promtool(text: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is missing: scripts/test installs Debian's prometheus package")
    return subprocess.run(
        [tool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )


class TestScrape:
    def test_a_hundred_jobs_show_in_counters_and_latency(self, server_factory):
        """After 100 jobs: promtool is clean, the transitions counter and the submit->start
        histogram hold them, jobs by state says 100 succeeded, and requests are counted by
        route template (no job id in any label)."""
        s = server_factory()
        r = s.api("POST", "/api/v1/jobs", json=[{"command": ["true"]} for _ in range(100)])
        assert r.status_code == 201, r.text
        ids = r.json()["ids"]

        def done() -> bool:
            got = s.api("GET", "/api/v1/jobs", params={"state": "succeeded", "limit": 1000})
            return len(got.json()) == 100

        wait_for(done, 240, "100 jobs to succeed")
        assert s.api("GET", f"/api/v1/jobs/{ids[0]}").status_code == 200
        text = scrape(s)
        checked = promtool(text)
        assert checked.returncode == 0 and not checked.stdout.strip(), (
            checked.stdout + checked.stderr
        )
        got = samples(text)
        assert value(got, "berth_job_transitions_total", state="succeeded") == 100
        assert value(got, "berth_job_transitions_total", state="leased") == 100
        assert total(got, "berth_job_start_latency_seconds_count") == 100
        assert total(got, "berth_job_start_latency_seconds_bucket", le="+Inf") == 100
        assert value(got, "berth_jobs", state="succeeded") == 100
        assert value(got, "berth_leader") == 1
        assert value(got, "berth_worker_sessions") == 1  # the built-in worker
        wait_for(
            lambda: total(samples(scrape(s)), "berth_heartbeat_ack_latency_seconds_count") > 0,
            60,
            "a heartbeat acked",
        )
        assert ("berth_relay_sessions", ()) in got
        assert total(got, "berth_db_statements_total") > 0
        assert (
            value(
                got,
                "berth_http_requests_total",
                method="POST",
                route="/api/v1/jobs",
                status="201",
            )
            == 1
        )
        routes = {dict(ls).get("route") for (n, ls), _ in got.items() if "route" in dict(ls)}
        assert "/api/v1/jobs/{job_id}" in routes
        assert f"/api/v1/jobs/{ids[0]}" not in routes

    def test_who_may_read_it(self, server_factory):
        """Admin, operator and a metrics token read it; a member gets 403, and a metrics
        token reads nothing else."""
        s = server_factory(builtin_worker=False)
        tokens = {}
        for kind in ("operator", "metrics", "service"):
            r = s.cli("token", "create", f"t-{kind}", "--kind", kind, "--tenant", "a")
            assert r.code == 0, r.err
            tokens[kind] = r.out.strip()
        assert s.api("GET", "/metrics").status_code == 200
        assert s.api("GET", "/metrics", token=tokens["operator"]).status_code == 200
        assert s.api("GET", "/metrics", token=tokens["metrics"]).status_code == 200
        member = s.api("GET", "/metrics", token=tokens["service"])
        assert member.status_code == 403 and member.json()["status"] == 403
        assert s.api("GET", "/api/v1/jobs", token=tokens["metrics"]).status_code == 403
        assert s.api("GET", "/metrics", token="brt_nope").status_code == 401


class TestServers:
    def test_queue_depths_agree_across_servers(self, server_factory):
        """Two servers on one database export the same queue depth per pool and kind."""
        a = server_factory(GPU, builtin_worker=False, name="a")
        b = server_factory(GPU, builtin_worker=False, name="b")
        jobs = [{"command": ["true"], "pool": "gpu"}] * 3 + [
            {"command": ["true"], "pool": "gpu", "kind": "big"}
        ] * 2
        assert a.api("POST", "/api/v1/jobs", json=jobs).status_code == 201
        assert b.api("POST", "/api/v1/jobs", json={"command": ["true"]}).status_code == 201
        for s in (a, b):
            got = samples(scrape(s))
            assert value(got, "berth_queue_depth_jobs", pool="gpu", kind="default") == 3
            assert value(got, "berth_queue_depth_jobs", pool="gpu", kind="big") == 2
            assert value(got, "berth_queue_depth_jobs", pool="*", kind="default") == 1
            assert value(got, "berth_jobs", state="queued") == 6
        leaders = [value(samples(scrape(s)), "berth_leader") for s in (a, b)]
        assert sorted(leaders) == [0, 1]
