"""Operator limits (core.limits): which keys may be overridden, how values parse, and the
effective config they make."""

import json
import math
from pathlib import Path

import pytest

from service.config import Config, load
from service.core import limits
from service.core.errors import Invalid

BASE = {
    "pools": {
        "gpu": {
            "slots": {"agent": 2, "eval": 1},
            "max_load": 8.0,
            "provisioner": {"max": 4, "idle_seconds": 300},
        },
        "cpu": {"slots": {"default": 3}},
    }
}


def config(data: dict | None = None) -> Config:
    overlay = {"BERTH_CONFIG_JSON": json.dumps(BASE if data is None else data)}
    return load(Path("/nonexistent/berth.toml"), environ=overlay)


class TestKeys:
    @pytest.mark.parametrize(
        ("key", "raw", "expected"),
        [
            pytest.param("pools.gpu.slots.agent", "1", 1, id="slots-from-cli-string"),
            pytest.param("pools.gpu.slots.agent", 0, 0, id="slots-zero-from-json"),
            pytest.param("pools.gpu.slots.new-kind.v2", " 5 ", 5, id="slots-kind-not-listed"),
            pytest.param("pools.serve.slots.default", "1", 1, id="builtin-serve-pool"),
            pytest.param("pools.cpu.max_load", "2.5", 2.5, id="max-load-string"),
            pytest.param("pools.cpu.max_load", 0, 0.0, id="max-load-zero"),
            pytest.param("pools.gpu.min_memory_gb", 16, 16.0, id="min-memory-int"),
            pytest.param("pools.serve.min_disk_gb", "1e2", 100.0, id="min-disk-exponent"),
            pytest.param("pools.gpu.provisioner.max", "0", 0, id="provisioner-max"),
            pytest.param("pools.gpu.provisioner.idle_seconds", "0.5", 0.5, id="idle-seconds"),
            pytest.param("tenants.ml.max_queued", "10", 10, id="tenant-max-queued"),
            pytest.param("tenants.ml.max_queued", 0, 0, id="tenant-max-queued-zero"),
            pytest.param("tenants.default.max_queued", 5, 5, id="default-max-queued"),
            pytest.param("tenants.a.b.max_stored_gb", "0.5", 0.5, id="dotted-tenant-stored"),
            pytest.param("tenants.ml.max_stored_gb", 0, 0.0, id="tenant-stored-no-bound"),
        ],
    )
    def test_accepted(self, key, raw, expected):
        """Every key kind takes a good value, from a CLI string or a JSON number, typed."""
        value = limits.parse(config(), key, raw)
        assert value == expected and type(value) is type(expected)

    @pytest.mark.parametrize(
        ("key", "raw", "says"),
        [
            pytest.param("executor.loop_seconds", 1, "unknown limit key", id="not-a-pool-key"),
            pytest.param("pools.gpu.builtin", 1, "unknown limit key", id="pool-field-not-offered"),
            pytest.param("pools.gpu.provisioner.compute", 1, "unknown", id="provisioner-field"),
            pytest.param("pools.tpu.max_load", 1, "no pool 'tpu'", id="unknown-pool"),
            pytest.param("pools.cpu.provisioner.max", 1, "has no provisioner", id="no-provisioner"),
            pytest.param(
                "pools.serve.provisioner.idle_seconds", 1, "has no provisioner", id="serve-prov"
            ),
            pytest.param("tenants.ml.max_running", -1, "whole number >= 0", id="neg-running"),
            pytest.param("tenants.ml.max_gpus", 1.5, "whole number", id="frac-gpus"),
            pytest.param("pools.gpu.slots.-x", 1, "job kind", id="bad-kind"),
            pytest.param("pools.gpu.slots.agent", "-1", "whole number >= 0", id="negative-slots"),
            pytest.param("pools.gpu.slots.agent", 1.5, "whole number", id="fractional-slots"),
            pytest.param("pools.gpu.slots.agent", "two", "whole number", id="word-slots"),
            pytest.param("pools.gpu.slots.agent", True, "whole number", id="bool-slots"),
            pytest.param("pools.gpu.slots.agent", 2**31, "whole number", id="huge-slots"),
            pytest.param("pools.gpu.provisioner.max", "", "whole number", id="empty-max"),
            pytest.param("pools.gpu.max_load", "nan", "finite number >= 0", id="nan-load"),
            pytest.param("pools.gpu.max_load", "inf", "finite number", id="inf-load"),
            pytest.param("pools.gpu.max_load", -0.5, "finite number >= 0", id="negative-load"),
            pytest.param("pools.gpu.min_disk_gb", "lots", "finite number", id="word-disk"),
            pytest.param("pools.gpu.min_memory_gb", [1], "finite number", id="list-memory"),
            pytest.param("pools.gpu.max_load", 10**400, "finite number", id="huge-int-load"),
            pytest.param("pools.gpu.provisioner.idle_seconds", 0, "> 0", id="zero-idle"),
            pytest.param("pools.gpu.provisioner.idle_seconds", None, "> 0", id="null-idle"),
            pytest.param("tenants.ml.max_queued", "-1", "whole number >= 0", id="neg-queued"),
            pytest.param("tenants.ml.max_queued", 2.5, "whole number", id="frac-queued"),
            pytest.param("tenants.ml.max_stored_gb", "inf", "finite number", id="inf-stored"),
            pytest.param("tenants.ml.max_stored_gb", -1, "finite number >= 0", id="neg-stored"),
            pytest.param("tenants.ml.max_slots", 1, "tenants.T.max_queued", id="tenant-field"),
            pytest.param("tenants.-x.max_queued", 1, "a tenant is", id="bad-tenant-name"),
        ],
    )
    def test_refused_naming_the_key(self, key, raw, says):
        """A bad key or value is Invalid, and the message names the key and what it must be."""
        with pytest.raises(Invalid) as caught:
            limits.parse(config(), key, raw)
        assert key in caught.value.message and says in caught.value.message

    def test_tenant_quotas_are_whole_numbers_in_force(self):
        """max_running and max_gpus are limits now (per-job resources exist): whole numbers, and
        `effective` makes them the tenant's quotas without touching other tenants."""
        assert limits.parse(config(), "tenants.ml.max_gpus", "2") == 2
        eff = limits.effective(config(), {"tenants.ml.max_running": 3, "tenants.ml.max_gpus": 2})
        quota = eff.quotas().of("ml")
        assert (quota.max_running, quota.max_gpus) == (3, 2)
        assert quota.running_key == "tenants.ml.max_running"
        assert not eff.quotas().of("other")

    def test_unknown_key_lists_the_keys(self):
        """The refusal of an unknown key lists what may be set."""
        with pytest.raises(Invalid) as caught:
            limits.parse(config(), "pools", 1)
        assert all(k in caught.value.message for k in limits.KEYS)

    def test_too_long_key(self):
        """A key longer than the column is refused before anything else."""
        with pytest.raises(Invalid, match="too long"):
            limits.parse(config(), "pools.gpu.slots." + "k" * 300, 1)

    def test_long_value_is_cut_in_the_message(self):
        """A huge bad value is not echoed whole."""
        with pytest.raises(Invalid) as caught:
            limits.parse(config(), "pools.gpu.max_load", "x" * 10_000)
        assert len(caught.value.message) < 200

    def test_pool_names_with_dots(self):
        """A configured pool whose name has a dot is found by its whole name."""
        cfg = config({"pools": {"a.b": {"slots": {"default": 1}}, "a": {}}})
        assert limits.target(cfg, "pools.a.b.slots.x") == limits.Target("a.b", "slots", "x")
        assert limits.target(cfg, "pools.a.slots.x") == limits.Target("a", "slots", "x")

    @pytest.mark.parametrize(
        ("key", "expected"),
        [
            ("pools.gpu.slots.agent", 2),
            ("pools.gpu.slots.nope", None),
            ("pools.gpu.max_load", 8.0),
            ("pools.serve.slots.default", 2),
            ("pools.gpu.provisioner.max", 4),
            ("pools.gpu.provisioner.idle_seconds", 300.0),
            ("pools.gone.max_load", None),
        ],
    )
    def test_default_is_berth_toml(self, key, expected):
        """default() is berth.toml's value; None where berth.toml says nothing."""
        assert limits.default(config(), key) == expected


class TestEffective:
    def test_applies_overrides(self):
        """Overrides replace pool values, add slot kinds and reach pool_specs()."""
        base = config()
        eff = limits.effective(
            base,
            {
                "pools.gpu.slots.agent": 1,
                "pools.gpu.slots.big": "3",
                "pools.gpu.max_load": 2,
                "pools.cpu.min_disk_gb": 5.5,
                "pools.gpu.provisioner.max": 0,
                "pools.gpu.provisioner.idle_seconds": 30,
            },
        )
        gpu = eff.pools["gpu"]
        assert gpu.slots == {"agent": 1, "eval": 1, "big": 3}
        assert gpu.max_load == 2.0 and isinstance(gpu.max_load, float)
        assert gpu.provisioner is not None
        assert (gpu.provisioner.max, gpu.provisioner.idle_seconds) == (0, 30.0)
        assert gpu.provisioner.compute == base.pools["gpu"].provisioner.compute  # the rest kept
        specs = eff.pool_specs()
        assert specs["gpu"].slots == {"agent": 1, "eval": 1, "big": 3}
        assert specs["cpu"].min_disk_gb == 5.5
        assert specs["gpu"].max_load == 2.0

    def test_config_is_not_changed(self):
        """The berth.toml config stays as it was; the result is a new frozen config."""
        base = config()
        eff = limits.effective(base, {"pools.gpu.slots.agent": 0})
        assert base.pools["gpu"].slots == {"agent": 2, "eval": 1}
        assert eff is not base and eff.pools["gpu"] is not base.pools["gpu"]
        with pytest.raises(AttributeError):
            eff.pools["gpu"].max_load = 1.0  # type: ignore[misc]

    def test_builtin_pool_without_a_table(self):
        """An override of `serve` with no [pools.serve] keeps its defaults for the rest."""
        base = config()
        assert "serve" not in base.pools
        eff = limits.effective(base, {"pools.serve.slots.eval": 1, "pools.serve.max_load": 4})
        assert eff.pool_specs()["serve"].slots == {"default": 2, "eval": 1}
        assert eff.pool_specs()["serve"].max_load == 4.0
        assert eff.builtin_worker() == base.builtin_worker()

    def test_tenant_bounds(self):
        """tenants.T.* override T's bounds and tenants.default.* every tenant without its own;
        berth.toml's [tenants.T] keys stay in force where no limit is set."""
        base = config({"tenants": {"a": {"max_stored_gb": 2.0}, "default": {"max_queued": 7}}})
        assert limits.default(base, "tenants.a.max_queued") == 7
        assert limits.default(base, "tenants.a.max_stored_gb") == 2.0
        assert limits.default(base, "tenants.new.max_stored_gb") == 0.0
        eff = limits.effective(
            base,
            {
                "tenants.a.max_queued": "3",
                "tenants.default.max_stored_gb": 9,
                "tenants.b.max_queued": 1,
            },
        )
        a, b, c = (eff.tenant_bounds(t) for t in ("a", "b", "c"))
        assert (a.max_queued, a.max_stored_gb) == (3, 2.0)
        assert (b.max_queued, b.max_stored_gb) == (1, 9.0)
        assert (c.max_queued, c.max_stored_gb) == (7, 9.0)
        assert b.key("max_queued") == "tenants.b.max_queued"
        assert base.tenant_bounds("a").max_queued == 7  # berth.toml's config is not changed
        assert limits.unfit(base, {"tenants.zz.max_queued": 1}) == {}

    def test_no_overrides_is_the_same_config(self):
        """Nothing set: the config itself comes back."""
        base = config()
        assert limits.effective(base, {}) is base

    def test_unfit_overrides_are_skipped(self):
        """Overrides that no longer fit (pool or provisioner gone, bad stored value) are skipped."""
        base = config({"pools": {"gpu": {"slots": {"agent": 2}}}})
        stored = {
            "pools.removed.max_load": 1.0,
            "pools.gpu.provisioner.max": 2,  # the provisioner table left berth.toml
            "pools.gpu.max_load": math.nan,
            "pools.gpu.slots.agent": 1,  # this one still fits
        }
        eff = limits.effective(base, stored)
        assert eff.pool_specs()["gpu"].slots == {"agent": 1}
        assert eff.pools["gpu"].max_load == 0.0 and eff.pools["gpu"].provisioner is None
        assert "removed" not in eff.pools
        assert set(limits.unfit(base, stored)) == {
            "pools.removed.max_load",
            "pools.gpu.provisioner.max",
            "pools.gpu.max_load",
        }
        assert "no pool 'removed'" in limits.unfit(base, stored)["pools.removed.max_load"]
