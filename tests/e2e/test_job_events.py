"""GET /api/v1/jobs/{id}/events on a real server: a job's moves and output are pushed (LISTEN/
NOTIFY), and followers of a silent job cost the database nothing (berth_db_statements_total)."""

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.procs import Server, wait_for

FOLLOWERS = 200
WINDOW = 3.0  # seconds: twelve of the test config's 0.25 s loop intervals


def gated(gate: Path) -> list[str]:
    """A job that prints, stays silent until `gate` exists, then prints again and ends 3."""
    code = (
        "import os, sys, time\n"
        "print('before', flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        "print('after', flush=True)\n"
        "sys.exit(3)\n"
    )
    return ["python3", "-c", code]


def parse(raw: str) -> list[dict[str, Any]]:
    """The data of each event in an SSE text (keepalive comments dropped)."""
    lines = raw.splitlines()
    return [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]


def statements(s: Server) -> float:
    text = s.api("GET", "/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "berth_db_statements_total":
                return sample.value
    raise AssertionError("no berth_db_statements_total in /metrics")


def test_events_carry_moves_output_and_end(server_factory, shared_dir):
    s = server_factory()
    gate = shared_dir / "gate"
    job = s.api("POST", "/api/v1/jobs", json={"command": gated(gate)}).json()
    got: list[dict[str, Any]] = []
    with httpx.stream(
        "GET",
        f"{s.url}/api/v1/jobs/{job['id']}/events",
        headers={"Authorization": f"Bearer {s.token}"},
        timeout=60,
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        buf = ""
        for text in r.iter_text():
            buf += text
            got = parse(buf)
            if any(e.get("data") == "before\n" for e in got) and not gate.exists():
                gate.touch()  # only once the first line was pushed while the job runs
    types = [e["type"] for e in got]
    assert types[0] == "state" and types[-1] == "end"
    states = [e["state"] for e in got if e["type"] == "state"]
    assert states[-1] == "failed" and "running" in states
    assert [e["data"] for e in got if e["type"] == "output"] == ["before\n", "after\n"]
    assert got[-1] == {"type": "end", "state": "failed", "exit_code": 3, "error": got[-1]["error"]}
    running = next(e for e in got if e["type"] == "state" and e["state"] == "running")
    assert running["worker"]

    # Resuming after the first chunk sends the rest only.
    first = next(e["id"] for e in got if e["type"] == "output")
    again = parse(s.api("GET", f"/api/v1/jobs/{job['id']}/events?after={first}").text)
    assert [e["data"] for e in again if e["type"] == "output"] == ["after\n"]
    again = parse(
        s.api("GET", f"/api/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": str(first)}).text
    )
    assert [e["data"] for e in again if e["type"] == "output"] == ["after\n"]


def test_events_refuse_what_show_refuses(server_factory):
    """The checks of GET /api/v1/jobs/{id}: another tenant's job is not there (404), nor one
    that does not exist; a bad Last-Event-ID is a 400 naming it; no credential is a 401."""
    s = server_factory()
    assert s.api("GET", "/api/v1/jobs/999999/events").status_code == 404
    tokens = {}
    for tenant in ("a", "b"):
        r = s.api(
            "POST",
            "/api/v1/tokens",
            json={"name": f"svc-{tenant}", "kind": "service", "tenants": [tenant]},
        )
        assert r.status_code == 201, r.text
        tokens[tenant] = r.json()["token"]
    r = s.api("POST", "/api/v1/jobs", json={"command": ["true"]}, token=tokens["a"])
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    wait_for(
        lambda: s.api("GET", f"/api/v1/jobs/{job_id}").json()["state"] == "succeeded", 60, "end"
    )
    mine = s.api("GET", f"/api/v1/jobs/{job_id}/events", token=tokens["a"])
    assert mine.status_code == 200 and parse(mine.text)[-1]["type"] == "end"
    theirs = s.api("GET", f"/api/v1/jobs/{job_id}/events", token=tokens["b"])
    assert theirs.status_code == 404, theirs.text
    assert (
        theirs.json()["error"]
        == s.api("GET", f"/api/v1/jobs/{job_id}", token=tokens["b"]).json()["error"]
    )
    r = s.api("GET", "/api/v1/jobs/1/events", headers={"Last-Event-ID": "x"})
    assert r.status_code == 400 and "Last-Event-ID" in r.json()["error"]
    assert s.api("GET", "/api/v1/jobs/1/events", token="nope").status_code == 401


async def _follow(client: httpx.AsyncClient, url: str, running: asyncio.Event) -> list[dict]:
    events: list[dict[str, Any]] = []
    async with client.stream("GET", url) as r:
        assert r.status_code == 200
        buf = ""
        async for text in r.aiter_text():
            buf += text
            events = parse(buf)
            if any(e["type"] == "state" and e["state"] == "running" for e in events):
                running.set()
    return events


@pytest.mark.timeout(600)
def test_two_hundred_followers_of_a_silent_job_cost_no_statements(server_factory, shared_dir):
    """The server's loops run statements anyway: count a window without followers and one of the
    same length with 200; the followers must add none (old polling: ~2 per follower per 0.5 s)."""
    s = server_factory()
    gate = shared_dir / "gate"
    job = s.api("POST", "/api/v1/jobs", json={"command": gated(gate)}).json()
    wait_for(
        lambda: s.api("GET", f"/api/v1/jobs/{job['id']}/logs").json()["chunks"],
        120,
        "the job to print and go silent",
    )

    def window() -> float:
        before = statements(s)
        time.sleep(WINDOW)  # a period of no job activity is what is measured
        return statements(s) - before - 1  # the scrape itself reads the gauges once

    alone = window()

    async def run() -> list[list[dict[str, Any]]]:
        url = f"{s.url}/api/v1/jobs/{job['id']}/events"
        limits = httpx.Limits(max_connections=FOLLOWERS + 10)
        headers = {"Authorization": f"Bearer {s.token}"}
        async with httpx.AsyncClient(limits=limits, headers=headers, timeout=300) as client:
            flags = [asyncio.Event() for _ in range(FOLLOWERS)]
            tasks = [asyncio.create_task(_follow(client, url, f)) for f in flags]
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in flags)), 300)
            followed = await asyncio.to_thread(window)
            assert followed <= alone * 1.25 + 10, (alone, followed)
            gate.touch()
            return await asyncio.wait_for(asyncio.gather(*tasks), 300)

    every = asyncio.run(run())
    assert len(every) == FOLLOWERS
    for events in every:
        assert [e["data"] for e in events if e["type"] == "output"] == ["before\n", "after\n"]
        assert events[-1]["type"] == "end" and events[-1]["exit_code"] == 3
