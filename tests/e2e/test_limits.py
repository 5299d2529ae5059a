"""`berth limits` end to end: real servers and workers; a limit changes placement without a
restart, on every server sharing the database, and `unset` gives berth.toml back."""

import json
from pathlib import Path

from tests import marks
from tests.procs import Server, wait_for

GPU3 = {"pools": {"gpu": {"slots": {"default": 3}}}}
KEY = "pools.gpu.slots.default"


def attached(s: Server, name: str) -> bool:
    return any(w["name"] == name and w["attached"] for w in s.api("GET", "/api/v1/workers").json())


def slots_in_force(s: Server) -> dict:
    """The gpu pool's slots as server `s` applies them (its runtime, not the table)."""
    pools = {p["name"]: p for p in s.api("GET", "/api/v1/pools").json()}
    return pools["gpu"]["slots"]


def run_batch(via: Server, m: Path, n: int, seconds: float = 0.5) -> dict[str, int]:
    """Submit n jobs that record their own start and end; wait for them; the most that ran
    at once on each worker."""
    before = set(marks.copies(m)) if m.exists() else set()
    r = via.api(
        "POST",
        "/api/v1/jobs",
        json=[{"command": marks.script(m, seconds), "pool": "gpu"} for _ in range(n)],
    )
    assert r.status_code == 201, r.text
    ids = r.json()["ids"]

    def done() -> bool:
        return all(via.api("GET", f"/api/v1/jobs/{i}").json()["state"] == "succeeded" for i in ids)

    wait_for(done, 60, f"{n} jobs to succeed", every=0.2)
    workers = {i: via.api("GET", f"/api/v1/jobs/{i}").json()["worker"] for i in ids}
    spans: dict[str, list[tuple[float, float]]] = {}
    for job, runs in marks.copies(m).items():
        if job in before or job not in workers:
            continue
        assert len(runs) == 1, f"job {job} ran {len(runs)} times"
        spans.setdefault(workers[job], []).extend((c.start, c.last) for c in runs)
    return {w: peak(s) for w, s in spans.items()}


def peak(spans: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    running = most = 0
    for _, delta in events:
        running += delta
        most = max(most, running)
    return most


class TestLimitsChangePlacement:
    def test_slots_limit_without_restart_and_unset_restores(
        self, server_factory, worker_factory, shared_dir
    ):
        """slots.default=1 on a 3-slot pool: one job at a time on the worker; unset: several."""
        s = server_factory(GPU3, builtin_worker=False)
        worker_factory(s, s.worker_token("w1"), "gpu", name="w1")
        wait_for(lambda: attached(s, "w1"), 20, "w1 attached")
        r = s.cli("limits", "set", f"{KEY}=1", "--reason", "disk is slow, one at a time")
        assert r.code == 0, r.err
        assert "pools.gpu.slots.default=1 (berth.toml: 3)" in r.out
        assert slots_in_force(s) == {"default": 1}
        assert run_batch(s, shared_dir, 4) == {"w1": 1}

        listed = json.loads(s.cli("limits", "list", "--json").out)
        assert [(x["key"], x["value"], x["default"], x["set_by"]) for x in listed] == [
            (KEY, 1, 3, "human:admin")
        ]
        assert listed[0]["reason"] == "disk is slow, one at a time"
        table = s.cli("limits", "list").out
        assert KEY in table and "disk is slow, one at a time" in table
        status = s.cli("status")
        assert status.code == 0, status.err
        assert "pool     gpu: 1 worker(s) attached, slots default=1" in status.out
        assert "disk is slow, one at a time" in status.out and "human:admin" in status.out
        pools = s.cli("pool", "list")
        assert "default=1*" in pools.out and "disk is slow, one at a time" in pools.out

        r = s.cli("limits", "unset", KEY)
        assert r.code == 0 and "berth.toml's 3" in r.out, r.err
        assert json.loads(s.cli("limits", "list", "--json").out) == []
        assert slots_in_force(s) == {"default": 3}
        assert run_batch(s, shared_dir, 3, seconds=1.5)["w1"] >= 2

    def test_refusals_are_one_line(self, server_factory):
        """Bad keys and values are refused by the CLI in one line naming the key, no traceback."""
        s = server_factory(GPU3, builtin_worker=False)
        for args, says, code in [
            (["set", "pools.tpu.slots.default=1", "--reason", "x"], "no pool 'tpu'", 201),
            (["set", f"{KEY}=-2", "--reason", "x"], "whole number >= 0", 201),
            (["set", "tenants.ml.max_gpus=1.5", "--reason", "x"], "whole number >= 0", 201),
            (["set", KEY, "--reason", "x"], "expected KEY=VALUE", 201),
            (["set", f"{KEY}=1", "--reason", " "], "needs a reason", 201),
            (["unset", KEY], f"no limit '{KEY}' is set", 203),
        ]:
            r = s.cli("limits", *args)
            assert r.code == code, (args, r.out, r.err)  # bad input, or not found
            assert says in r.err and len(r.err.strip().splitlines()) == 1, (args, r.err)
            assert "Traceback" not in r.err
        r = s.cli("limits", "set", f"{KEY}=1")
        assert r.code == 201 and "--reason" in r.err
        assert json.loads(s.cli("limits", "list", "--json").out) == []


class TestTwoServers:
    def test_limit_set_on_a_is_in_force_on_bs_dispatch(
        self, server_factory, worker_factory, shared_dir
    ):
        """Set through server A, the limit governs server B's worker; unset through A, it lifts."""
        a = server_factory(GPU3, builtin_worker=False, name="a")
        b = server_factory(GPU3, builtin_worker=False, name="b")
        worker_factory(b, b.worker_token("wb"), "gpu", name="wb")
        wait_for(lambda: attached(a, "wb"), 20, "wb attached to b")
        r = a.cli("limits", "set", f"{KEY}=1", "--reason", "b's host is overloaded")
        assert r.code == 0, r.err
        wait_for(lambda: slots_in_force(b) == {"default": 1}, 10, "b to apply the limit")
        assert run_batch(a, shared_dir, 4) == {"wb": 1}
        assert "b's host is overloaded" in b.cli("status").out

        assert a.cli("limits", "unset", KEY).code == 0
        wait_for(lambda: slots_in_force(b) == {"default": 3}, 10, "b to lift the limit")
        assert run_batch(a, shared_dir, 3, seconds=1.5)["wb"] >= 2
