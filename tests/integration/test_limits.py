"""Limits through the API on a real Postgres: set, list, unset with reason, who and when;
audited; refusals change nothing; in force in status, pools, placement and on other servers."""

import asyncio
from datetime import datetime

import pytest

from service.api import limits_watch
from service.db import notify
from service.db.queries.limits import LIMITS_CHANNEL
from service.domain import limits
from tests.integration.conftest import Api

KEY = "pools.gpu.slots.default"
PROVISIONED = {
    "pools": {"gpu": {"slots": {"default": 2}, "provisioner": {"max": 4, "idle_seconds": 300}}}
}


async def put(api: Api, key: str, value: object, reason: str = "testing", **kw):
    return await api.call(
        "PUT", f"/api/v1/limits/{key}", json={"value": value, "reason": reason}, **kw
    )


async def listed(api: Api) -> list[dict]:
    r = await api.call("GET", "/api/v1/limits")
    assert r.status_code == 200, r.text
    return r.json()


async def audited(api: Api) -> list[dict]:
    r = await api.call("GET", "/api/v1/audit")
    assert r.status_code == 200, r.text
    return [e for e in r.json() if e["action"].startswith("limit.")]


class TestSetListUnset:
    async def test_set_list_unset(self, api: Api):
        """A limit is set with its reason, who and when, listed with berth.toml's value, unset."""
        r = await put(api, KEY, "1", "one job at a time while the disk is slow")
        assert r.status_code == 200, r.text
        shown = r.json()
        assert shown["key"] == KEY and shown["value"] == 1 and shown["default"] == 2
        assert shown["reason"] == "one job at a time while the disk is slow"
        assert shown["set_by"] == "human:admin" and shown["in_force"] is True
        assert datetime.fromisoformat(shown["set_at"]).tzinfo is not None
        assert await listed(api) == [shown]
        r = await api.call("DELETE", f"/api/v1/limits/{KEY}")
        assert r.status_code == 200, r.text
        assert r.json() == {"key": KEY, "unset": True, "was": 1, "default": 2}
        assert await listed(api) == []

    async def test_set_again_replaces(self, api: Api):
        """Setting a key again replaces value, reason and author; one row remains."""
        ops = await api.mint("ops", "operator")
        assert (await put(api, KEY, 1, "first")).status_code == 200
        r = await put(api, KEY, 0, "second", token=ops)
        assert r.status_code == 200, r.text
        [row] = await listed(api)
        assert (row["value"], row["reason"], row["set_by"]) == (0, "second", "human:ops")

    async def test_json_numbers_and_strings(self, api: Api):
        """The API takes a JSON number or a string, and stores the key's type."""
        assert (await put(api, "pools.gpu.max_load", 3)).json()["value"] == 3.0
        assert (await put(api, "pools.gpu.min_disk_gb", "2.5")).json()["value"] == 2.5
        assert (await put(api, "pools.serve.slots.default", 4)).json()["default"] == 2
        assert {x["key"] for x in await listed(api)} == {
            "pools.gpu.max_load",
            "pools.gpu.min_disk_gb",
            "pools.serve.slots.default",
        }

    async def test_set_and_unset_are_audited(self, api: Api):
        """limit.set and limit.unset are in the audit log, signed by the caller, with details."""
        ops = await api.mint("ops", "operator")
        await put(api, KEY, "1", "slow disk", token=ops)
        await put(api, KEY, "0", "slower disk")
        await api.call("DELETE", f"/api/v1/limits/{KEY}", token=ops)
        entries = list(reversed(await audited(api)))
        assert [(e["action"], e["caller"], e["target"]) for e in entries] == [
            ("limit.set", "human:ops", KEY),
            ("limit.set", "human:admin", KEY),
            ("limit.unset", "human:ops", KEY),
        ]
        assert entries[0]["detail"] == {"value": 1, "reason": "slow disk", "previous": None}
        assert entries[1]["detail"] == {"value": 0, "reason": "slower disk", "previous": 1}
        assert entries[2]["detail"] == {"previous": 0}

    async def test_provisioner_keys_on_a_provisioned_pool(self, api_with):
        """pools.P.provisioner.max and idle_seconds are taken on a pool with a provisioner."""
        api = await api_with(PROVISIONED)
        r = await put(api, "pools.gpu.provisioner.max", "0", "drain them all")
        assert r.status_code == 200 and r.json()["default"] == 4, r.text
        r = await put(api, "pools.gpu.provisioner.idle_seconds", 30)
        assert r.status_code == 200 and r.json()["value"] == 30.0, r.text
        eff = await limits.effective_config(api.rt.db, api.rt.config)
        assert eff.pools["gpu"].provisioner is not None
        assert eff.pools["gpu"].provisioner.max == 0
        assert eff.pools["gpu"].provisioner.idle_seconds == 30.0
        assert api.rt.config.pools["gpu"].provisioner.max == 4  # berth.toml unchanged
        pools = {p["name"]: p for p in (await api.call("GET", "/api/v1/pools")).json()}
        shown = pools["gpu"]["provisioner"]
        assert (shown["max"], shown["idle_seconds"], shown["provider"]) == (0, 30.0, "process")


class TestRefused:
    @pytest.mark.parametrize(
        ("key", "value", "says"),
        [
            pytest.param("pools.gpu.nope", 1, "unknown limit key", id="unknown-key"),
            pytest.param("executor.loop_seconds", 1, "unknown limit key", id="not-a-limit"),
            pytest.param("pools.tpu.slots.default", 1, "no pool 'tpu'", id="unknown-pool"),
            pytest.param("pools.gpu.provisioner.max", 1, "no provisioner", id="no-provisioner"),
            pytest.param("tenants.ml.max_running", -1, "whole number >= 0", id="tenant-quota"),
            pytest.param(KEY, -1, "whole number >= 0", id="negative"),
            pytest.param(KEY, "many", "whole number", id="not-a-number"),
            pytest.param(KEY, True, "whole number", id="boolean"),
            pytest.param(KEY, {"a": 1}, "whole number", id="object"),
            pytest.param("pools.gpu.max_load", "NaN", "finite number", id="nan"),
            pytest.param("pools.gpu.max_load", -1.5, "finite number >= 0", id="negative-float"),
        ],
    )
    async def test_bad_key_or_value_changes_nothing(self, api: Api, key, value, says):
        """400 JSON naming the key and the rule; nothing is stored, audited or applied."""
        r = await put(api, key, value)
        assert r.status_code == 400, r.text
        assert key in r.json()["error"] and says in r.json()["error"]
        assert await listed(api) == []
        assert await audited(api) == []
        assert api.rt.pools == api.rt.config.pool_specs()

    @pytest.mark.parametrize(
        "body",
        [
            pytest.param({"value": 1}, id="no-reason"),
            pytest.param({"value": 1, "reason": ""}, id="empty-reason"),
            pytest.param({"value": 1, "reason": "   "}, id="blank-reason"),
            pytest.param({"value": 1, "reason": "x" * 1001}, id="long-reason"),
            pytest.param({"value": 1, "reason": "a\x00b"}, id="nul-in-reason"),
            pytest.param({"value": 1, "reason": "ok", "by": "someone"}, id="unknown-field"),
            pytest.param({"reason": "ok"}, id="no-value"),
        ],
    )
    async def test_bad_body_changes_nothing(self, api: Api, body):
        """A body without a proper reason, or with unknown fields, is a 400; nothing changes."""
        r = await api.call("PUT", f"/api/v1/limits/{KEY}", json=body)
        assert r.status_code == 400, r.text
        assert await listed(api) == []
        assert await audited(api) == []

    async def test_member_may_read_but_not_write(self, api: Api):
        """A member (service token) gets 403 on PUT and DELETE, and may list."""
        member = await api.mint("ci", "service", "ml")
        assert (await put(api, KEY, 1, token=member)).status_code == 403
        assert (await put(api, KEY, 1)).status_code == 200
        r = await api.call("DELETE", f"/api/v1/limits/{KEY}", token=member)
        assert r.status_code == 403
        assert [x["key"] for x in await listed(api)] == [KEY]
        r = await api.call("GET", "/api/v1/limits", token=member)
        assert r.status_code == 200 and len(r.json()) == 1

    async def test_unset_of_a_key_not_set_is_404(self, api: Api):
        """Unsetting what is not set is a 404 naming the key, and is not audited."""
        r = await api.call("DELETE", f"/api/v1/limits/{KEY}")
        assert r.status_code == 404 and KEY in r.json()["error"]
        assert await audited(api) == []


class TestInForce:
    async def test_status_and_pools_show_value_in_force_and_reason(self, api: Api):
        """status and pools show the value in force, berth.toml's, and who set it, when, why."""
        await put(api, KEY, 1, "slow disk")
        st = (await api.call("GET", "/api/v1/status")).json()
        assert st["pools"]["gpu"]["slots"] == {"default": 1}
        [lim] = st["limits"]
        assert {k: lim[k] for k in ("key", "value", "default", "reason", "set_by")} == {
            "key": KEY,
            "value": 1,
            "default": 2,
            "reason": "slow disk",
            "set_by": "human:admin",
        }
        assert lim["set_at"]
        pools = {p["name"]: p for p in (await api.call("GET", "/api/v1/pools")).json()}
        assert pools["gpu"]["slots"] == {"default": 1}
        assert [x["reason"] for x in pools["gpu"]["limits"]] == ["slow disk"]
        assert pools["serve"]["limits"] == [] and pools["serve"]["slots"] == {"default": 2}
        await api.call("DELETE", f"/api/v1/limits/{KEY}")
        st = (await api.call("GET", "/api/v1/status")).json()
        assert st["pools"]["gpu"]["slots"] == {"default": 2} and st["limits"] == []

    async def test_runtime_pools_follow_and_config_stays(self, api: Api):
        """The server that took the write applies it at once; rt.config stays berth.toml."""
        await put(api, KEY, 0)
        await put(api, "pools.gpu.max_load", "1.5")
        assert api.rt.pools["gpu"].slots == {"default": 0}
        assert api.rt.pools["gpu"].max_load == 1.5
        assert api.rt.effective.pools["gpu"].slots == {"default": 0}
        assert api.rt.config.pools["gpu"].slots == {"default": 2}
        await api.call("DELETE", f"/api/v1/limits/{KEY}")
        assert api.rt.pools["gpu"].slots == {"default": 2}

    async def test_a_new_kind_is_open_to_jobs(self, api: Api):
        """A slot kind added by a limit is one jobs may ask for; unset, it is refused again."""
        job = {"command": ["true"], "pool": "gpu", "kind": "big"}
        r = await api.call("POST", "/api/v1/jobs", json=job)
        assert r.status_code == 400 and "no slots of kind 'big'" in r.text
        assert (await put(api, "pools.gpu.slots.big", 1)).status_code == 200
        r = await api.call("POST", "/api/v1/jobs", json=job)
        assert r.status_code == 201, r.text
        await api.call("DELETE", "/api/v1/limits/pools.gpu.slots.big")
        assert (await api.call("POST", "/api/v1/jobs", json=job)).status_code == 400

    async def test_another_server_applies_it_on_notify(self, api_with, db_url):
        """A write on server A reaches server B by NOTIFY berth_limits_v1; B's pools follow."""
        a = await api_with({"pools": {"gpu": {"slots": {"default": 3}}}})
        b = await api_with({"pools": {"gpu": {"slots": {"default": 3}}}})
        await b.rt.limits_watch.refresh()
        rt = b.rt  # a watch of B's limits with no safety-net read in this test
        watch = limits_watch.Watch(
            rt.db, rt.config, rt.limits_watch.state, on_change=rt.hub.poke, every=3600
        )
        stop, ready = asyncio.Event(), asyncio.Event()
        heard: list[str] = []

        def on_notice(payload: str) -> None:
            heard.append(payload)
            watch.poke()

        tasks = [
            asyncio.create_task(
                notify.listen(db_url, {LIMITS_CHANNEL: on_notice}, stop, ready=ready)
            ),
            asyncio.create_task(watch.run(stop)),
        ]
        try:
            await asyncio.wait_for(ready.wait(), 10)
            assert (await put(a, KEY, 1, "via notify")).status_code == 200
            await _until(lambda: b.rt.pools["gpu"].slots == {"default": 1}, "B applies the limit")
            assert heard == [KEY]
            assert b.rt.limits is not None and b.rt.limits.shown()[0]["reason"] == "via notify"
            st = (await b.call("GET", "/api/v1/status")).json()
            assert st["pools"]["gpu"]["slots"] == {"default": 1}
            assert (await a.call("DELETE", f"/api/v1/limits/{KEY}")).status_code == 200
            await _until(lambda: b.rt.pools["gpu"].slots == {"default": 3}, "B restores it")
        finally:
            stop.set()
            await asyncio.gather(*tasks)

    async def test_a_limit_whose_pool_left_berth_toml(self, api_with):
        """Set on a server that has pool old; one without it lists it as not in force, runs, and
        may unset it."""
        a = await api_with({"pools": {"old": {}, "gpu": {}}})
        b = await api_with({"pools": {"gpu": {}}})
        assert (await put(a, "pools.old.max_load", 2, "old pool")).status_code == 200
        assert await b.rt.limits_watch.refresh() is False  # nothing b applies changed
        assert "old" not in b.rt.pools
        [row] = await listed(b)
        assert row["in_force"] is False and "no pool 'old'" in row["not_in_force_because"]
        assert row["default"] is None
        st = (await b.call("GET", "/api/v1/status")).json()
        assert [x["key"] for x in st["limits"]] == ["pools.old.max_load"]
        assert (await b.call("DELETE", "/api/v1/limits/pools.old.max_load")).status_code == 200


async def _until(predicate, what: str, timeout: float = 10.0) -> None:
    """Wait for a condition (not for a time): check, yield to the loop, check again."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.02)
