"""Configuration: defaults, file + overlay merging, validation and the listen address helpers."""

import json
import re
from pathlib import Path

import pytest

from service.config import Config, is_loopback, load, split_listen
from service.core.errors import Invalid


def overlay(data: object) -> dict[str, str]:
    return {"BERTH_CONFIG_JSON": json.dumps(data)}


@pytest.fixture
def absent(tmp_path: Path) -> Path:
    return tmp_path / "missing.toml"


@pytest.fixture
def toml_file(tmp_path: Path) -> Path:
    path = tmp_path / "berth.toml"
    path.write_text(
        """
[database]
url = "postgresql://file/db"

[network]
listen = "0.0.0.0:9000"
url = "https://berth.example"

[executor]
heartbeat_seconds = 2
unreachable_seconds = 8
kill_grace_seconds = 3

[pools.gpu]
slots = { agent = 2, eval = 1 }
max_load = 3.5
"""
    )
    return path


class TestDefaults:
    def test_absent_file_gives_defaults(self, absent):
        """With no file and no overlay, every key takes its documented default."""
        config = load(absent, environ={})
        assert config == Config()
        assert config.database.url == ""
        assert config.network.listen == "127.0.0.1:8443"
        assert config.network.tls == ""
        assert config.network.auth == "token"
        assert config.executor.heartbeat_seconds == 10.0
        assert config.executor.unreachable_seconds == 30.0
        assert config.executor.evict_seconds == 60.0
        assert config.executor.kill_grace_seconds == 5.0
        assert config.database.embedded_check_seconds == 1.0
        assert config.database.embedded_restart_max_seconds == 30.0
        assert config.pools == {}
        assert config.cas.provider == "local"

    def test_pool_defaults(self, absent):
        """A pool named without keys gets `default = 2` slots, no thresholds and no provisioner."""
        pool = load(absent, environ=overlay({"pools": {"p": {}}})).pools["p"]
        assert pool.slots == {"default": 2}
        assert (pool.max_load, pool.min_memory_gb, pool.min_disk_gb) == (0.0, 0.0, 0.0)
        assert pool.provisioner is None
        assert (pool.approvals, pool.approval_timeout_seconds) == ("four-eyes", 3600.0)

    @pytest.mark.parametrize(
        ("pool", "words"),
        [
            (
                {"approvals": "anyone"},
                r"Invalid enum value .anyone. - at `\$\.pools\[\.\.\.\]\.approvals`",
            ),
            ({"approval_timeout_seconds": 0}, r"pools\.p\.approval_timeout_seconds must be"),
            ({"approval_timeout_seconds": "nan"}, "approval_timeout_seconds"),
            ({"approval_timeout_seconds": 400 * 86400}, "366 days"),
        ],
    )
    def test_approval_keys(self, absent, pool, words):
        """Who answers is one of two policies; the timeout is positive and at most 366 days."""
        with pytest.raises(Invalid, match=words):
            load(absent, environ=overlay({"pools": {"p": pool}}))

    def test_provisioner_defaults(self, absent):
        """An empty provisioner table takes the documented max, idle, orphan and provider."""
        config = load(absent, environ=overlay({"pools": {"p": {"provisioner": {}}}}))
        prov = config.pools["p"].provisioner
        assert prov is not None
        assert (prov.max, prov.idle_seconds, prov.orphan_exit_seconds) == (4, 300.0, 600.0)
        assert prov.compute.provider == "process"


class TestLoad:
    def test_reads_toml(self, toml_file):
        """Keys in the file override the defaults; unnamed keys keep theirs."""
        config = load(toml_file, environ={})
        assert config.database.url == "postgresql://file/db"
        assert config.network.listen == "0.0.0.0:9000"
        assert config.executor.heartbeat_seconds == 2.0
        assert config.executor.evict_seconds == 60.0
        assert config.pools["gpu"].slots == {"agent": 2, "eval": 1}
        assert config.pools["gpu"].max_load == 3.5

    def test_json_overlay_merges_deeply(self, toml_file):
        """BERTH_CONFIG_JSON merges table by table over the file; scalars and slots replace."""
        env = overlay(
            {
                "network": {"listen": "127.0.0.1:7000"},
                "executor": {"evict_seconds": 0.5},
                "pools": {"gpu": {"slots": {"agent": 1}}, "cpu": {}},
            }
        )
        config = load(toml_file, environ=env)
        assert config.network.listen == "127.0.0.1:7000"
        assert config.network.url == "https://berth.example"
        assert config.executor.heartbeat_seconds == 2.0
        assert config.executor.unreachable_seconds == 8.0
        assert config.executor.evict_seconds == 0.5
        assert config.pools["gpu"].slots == {"agent": 1, "eval": 1}
        assert config.pools["gpu"].max_load == 3.5
        assert set(config.pools) == {"gpu", "cpu"}

    def test_database_url_env_wins(self, toml_file):
        """BERTH_DATABASE_URL overrides both the file's and the overlay's database.url."""
        env = {**overlay({"database": {"url": "postgresql://json/db"}})}
        env["BERTH_DATABASE_URL"] = "postgresql://env/db"
        assert load(toml_file, environ=env).database.url == "postgresql://env/db"
        assert load(toml_file, environ={}).database.url == "postgresql://file/db"

    def test_empty_database_url_env_ignored(self, toml_file):
        """An empty BERTH_DATABASE_URL leaves the configured URL alone."""
        assert load(toml_file, environ={"BERTH_DATABASE_URL": ""}).database.url.endswith("file/db")

    def test_default_path_under_berth_home(self, tmp_path):
        """Without a path, $BERTH_HOME/berth.toml is read."""
        (tmp_path / "berth.toml").write_text('[network]\nlisten = "127.0.0.1:1234"\n')
        config = load(environ={"BERTH_HOME": str(tmp_path)})
        assert config.network.listen == "127.0.0.1:1234"

    def test_tls_files_table(self, absent):
        """network.tls accepts a {cert, key} table as well as a string."""
        env = overlay({"network": {"tls": {"cert": "c.pem", "key": "k.pem"}}})
        tls = load(absent, environ=env).network.tls
        assert not isinstance(tls, str)
        assert (tls.cert, tls.key) == ("c.pem", "k.pem")


class TestInvalid:
    @pytest.mark.parametrize(
        ("data", "words"),
        [
            ({"network": {"lisen": "x"}}, ["`lisen`", "$.network"]),
            ({"bogus": 1}, ["`bogus`"]),
            ({"pools": {"p": {"slot": {"a": 1}}}}, ["`slot`", "$.pools[...]"]),
            ({"executor": {"heartbeat_seconds": "fast"}}, ["$.executor.heartbeat_seconds"]),
            ({"pools": {"p": {"slots": {"a": "two"}}}}, ["`int`", "slots[...]"]),
            ({"network": {"auth": "ldap"}}, ["$.network.auth"]),
            ({"cas": {"provider": "ftp"}}, ["$.cas.provider"]),
        ],
    )
    def test_bad_keys_and_types_named(self, absent, data, words):
        """An unknown key or a wrong type is refused with a message naming where it is."""
        with pytest.raises(Invalid) as info:
            load(absent, environ=overlay(data))
        for word in words:
            assert word in info.value.message

    def test_unknown_key_in_file(self, tmp_path):
        """An unknown key in the TOML file names the key too."""
        path = tmp_path / "berth.toml"
        path.write_text('[network]\nlisen = "127.0.0.1:1"\n')
        with pytest.raises(Invalid, match="`lisen`"):
            load(path, environ={})

    def test_bad_toml(self, tmp_path):
        """A file that is not TOML is refused, naming the file."""
        path = tmp_path / "berth.toml"
        path.write_text("[network\n")
        with pytest.raises(Invalid, match=r"berth\.toml"):
            load(path, environ={})

    def test_invalid_json_overlay(self, absent):
        """An overlay that is not JSON is refused, naming BERTH_CONFIG_JSON."""
        with pytest.raises(Invalid, match=r"^BERTH_CONFIG_JSON: "):
            load(absent, environ={"BERTH_CONFIG_JSON": "{network:"})

    @pytest.mark.parametrize("value", ["[1, 2]", '"text"', "3", "null"])
    def test_non_object_overlay(self, absent, value):
        """An overlay that is JSON but not an object is refused."""
        with pytest.raises(Invalid, match="BERTH_CONFIG_JSON: must be a JSON object"):
            load(absent, environ={"BERTH_CONFIG_JSON": value})

    @pytest.mark.parametrize("listen", ["8443", "localhost", ":8443", "host:", "h:port", "h:70000"])
    def test_bad_listen(self, absent, listen):
        """A listen that is not HOST:PORT is refused, naming network.listen."""
        with pytest.raises(Invalid, match=r"network\.listen"):
            load(absent, environ=overlay({"network": {"listen": listen}}))

    @pytest.mark.parametrize(
        ("executor", "words"),
        [
            ({"heartbeat_seconds": 10, "unreachable_seconds": 10, "evict_seconds": 20}, "three"),
            ({"heartbeat_seconds": 1, "unreachable_seconds": 1, "evict_seconds": 2}, "three"),
            ({"heartbeat_seconds": 0}, "executor.heartbeat_seconds must be positive"),
            ({"unreachable_seconds": -1}, "executor.unreachable_seconds must be positive"),
            ({"evict_seconds": 0}, "executor.evict_seconds must be positive"),
            ({"loop_seconds": 0}, "executor.loop_seconds must be positive"),
            ({"heartbeat_seconds": 2, "kill_grace_seconds": 4}, "kill_grace_seconds"),
            ({"heartbeat_seconds": 0.5, "kill_grace_seconds": 1.0}, "two heartbeats"),
            ({"kill_grace_seconds": -1}, "kill_grace_seconds"),
            ({"forget_lost_after_seconds": 0}, "executor.forget_lost_after_seconds must be"),
            ({"forget_lost_after_seconds": "nan"}, "forget_lost_after_seconds"),
        ],
    )
    def test_executor_timing(self, absent, executor, words):
        """Durations must be positive, unreachable + evict must exceed three heartbeats, and
        the kill grace must fit inside the two heartbeats a silent worker keeps in hand."""
        with pytest.raises(Invalid, match=words):
            load(absent, environ=overlay({"executor": executor}))

    @pytest.mark.parametrize("key", ["embedded_check_seconds", "embedded_restart_max_seconds"])
    def test_embedded_supervisor_timing(self, absent, key):
        """The embedded Postgres' check and restart intervals must be positive, named if not."""
        with pytest.raises(Invalid, match=rf"database\.{key} must be positive"):
            load(absent, environ=overlay({"database": {key: 0}}))

    def test_executor_timing_just_enough(self, absent):
        """Short fractional durations pass when unreachable + evict exceed three heartbeats."""
        executor = {
            "heartbeat_seconds": 0.1,
            "unreachable_seconds": 0.2,
            "evict_seconds": 0.11,
            "kill_grace_seconds": 0.15,
        }
        config = load(absent, environ=overlay({"executor": executor}))
        assert config.executor.evict_seconds == 0.11

    def test_forget_lost_after_default_and_set(self, absent):
        """A lost worker is forgotten after a day by default; the key takes seconds."""
        assert load(absent, environ={}).executor.forget_lost_after_seconds == 86400.0
        config = load(absent, environ=overlay({"executor": {"forget_lost_after_seconds": 0.5}}))
        assert config.executor.forget_lost_after_seconds == 0.5

    def test_database_urls(self, absent):
        """A database URL berth cannot use is refused naming the key, never its password;
        PostgreSQL URLs in their usual shapes pass."""
        for url, words in (
            ("mysql://x/y", "database.url 'mysql://x/y' uses mysql://: berth needs PostgreSQL"),
            (
                "postgresql://u:pw@h:port/db",
                "database.url 'postgresql://u:***@h:port/db' is malformed",
            ),
            ("db.example:5432", "is not a URL"),
        ):
            with pytest.raises(Invalid, match=re.escape(words)) as err:
                load(absent, environ=overlay({"database": {"url": url}}))
            assert ":pw@" not in err.value.message
            with pytest.raises(Invalid, match=r"^BERTH_DATABASE_URL "):
                load(absent, environ={"BERTH_DATABASE_URL": url})
        for url in (
            "postgresql://berth:pw@db.internal:5432/berth?sslmode=verify-full",
            "postgres://root@127.0.0.1/x",
            "postgresql+asyncpg://u@[::1]:5432/x",
            "postgresql:///berth?host=/var/run/postgresql",
        ):
            assert load(absent, environ={"BERTH_DATABASE_URL": url}).database.url == url

    @pytest.mark.parametrize("slots", [{}, {"a": -1}, {"a": 2, "b": -3}])
    def test_pool_slots(self, absent, slots):
        """A pool's slots must name at least one kind and none may be negative."""
        with pytest.raises(Invalid, match=r"pools\.p\.slots"):
            load(absent, environ=overlay({"pools": {"p": {"slots": slots}}}))

    def test_pool_zero_slots_allowed(self, absent):
        """A kind with 0 slots is allowed."""
        assert load(absent, environ=overlay({"pools": {"p": {"slots": {"a": 0}}}})).pools

    @pytest.mark.parametrize(
        ("rule", "error"),
        [
            ({"when": {"user": "a"}}, r"rules\[0\]: a human rule needs a role"),
            ({"when": {"user": "a"}, "caller": "service"}, "a service rule needs a role"),
            ({"when": {}, "role": "viewer"}, r"rules\[0\]\.when"),
            ({"when": {"user": "a"}, "role": "root"}, "role"),
        ],
    )
    def test_proxy_rules(self, absent, rule, error):
        """A human or service proxy rule needs a role, and every rule a `when`."""
        with pytest.raises(Invalid, match=error):
            load(absent, environ=overlay({"network": {"proxy": {"rules": [rule]}}}))

    def test_worker_rule_needs_no_role(self, absent):
        """A worker proxy rule is valid without a role."""
        rule = {"when": {"principal": "worker"}, "caller": "worker"}
        config = load(absent, environ=overlay({"network": {"proxy": {"rules": [rule]}}}))
        assert config.network.proxy.rules[0].role is None


class TestPoolSpecs:
    def test_serve_pool_built_in(self):
        """pool_specs always includes the built-in `serve` pool with two default slots."""
        spec = Config().pool_specs()["serve"]
        assert spec.name == "serve"
        assert dict(spec.slots) == {"default": 2}
        assert spec.max_load == 0.0

    def test_configured_pools_and_serve_override(self, absent):
        """Configured pools keep their thresholds; a configured `serve` replaces the default."""
        data = {
            "pools": {"gpu": {"slots": {"a": 1}, "min_disk_gb": 5}, "serve": {"slots": {"x": 4}}}
        }
        specs = load(absent, environ=overlay(data)).pool_specs()
        assert set(specs) == {"serve", "gpu"}
        assert dict(specs["gpu"].slots) == {"a": 1}
        assert specs["gpu"].min_disk_gb == 5.0
        assert dict(specs["serve"].slots) == {"x": 4}


class TestListenHelpers:
    @pytest.mark.parametrize(
        ("listen", "expected"),
        [
            ("127.0.0.1:8443", ("127.0.0.1", 8443)),
            ("0.0.0.0:0", ("0.0.0.0", 0)),  # noqa: S104
            ("localhost:65535", ("localhost", 65535)),
            ("berth.example.com:443", ("berth.example.com", 443)),
            ("[::1]:8443", ("::1", 8443)),
            ("[::]:80", ("::", 80)),
        ],
    )
    def test_split_listen(self, listen, expected):
        """HOST:PORT splits into host (IPv6 brackets removed) and an integer port."""
        assert split_listen(listen) == expected

    @pytest.mark.parametrize(
        "listen", ["", "8443", ":8443", "host:", "host:-1", "host:65536", "host:x1", "host:²"]
    )
    def test_split_listen_refuses(self, listen):
        """Anything but HOST:PORT with a port in 0..65535 raises Invalid naming network.listen."""
        with pytest.raises(Invalid, match=r"network\.listen"):
            split_listen(listen)

    @pytest.mark.parametrize(
        ("host", "loopback"),
        [
            ("localhost", True),
            ("127.0.0.1", True),
            ("127.8.9.10", True),
            ("::1", True),
            ("0.0.0.0", False),  # noqa: S104
            ("::", False),
            ("10.0.0.1", False),
            ("berth.example.com", False),
            ("", False),
        ],
    )
    def test_is_loopback(self, host, loopback):
        """Only `localhost` and loopback addresses count as loopback."""
        assert is_loopback(host) is loopback


class TestBounds:
    def test_defaults(self, absent):
        """The bounds take SPEC section 3's defaults; every tenant lives under them."""
        config = load(absent, environ={})
        assert config.cas.max_blob_gb == 50.0
        assert config.executor.relay_max_save_gb == 10.0
        assert config.executor.relay_max_in_flight == 8
        bounds = config.tenant_bounds("anyone")
        assert (bounds.max_queued, bounds.max_stored_gb) == (100000, 0.0)
        assert bounds.key("max_queued") == "tenants.default.max_queued"

    def test_tenant_tables_load_and_fall_back_to_default(self, tmp_path):
        """[tenants.default] sets every tenant's bounds; [tenants.T] overrides only the keys
        it sets, the others still [tenants.default]'s."""
        path = tmp_path / "berth.toml"
        path.write_text(
            """
[executor]
relay_max_save_gb = 0.5
relay_max_in_flight = 2

[cas]
max_blob_gb = 1.5

[tenants.default]
max_queued = 50
max_stored_gb = 20.0

[tenants."ml.team"]
max_queued = 5
"""
        )
        config = load(path, environ={})
        assert (config.executor.relay_max_save_gb, config.executor.relay_max_in_flight) == (0.5, 2)
        assert config.cas.max_blob_gb == 1.5
        ml = config.tenant_bounds("ml.team")
        assert (ml.max_queued, ml.max_stored_gb) == (5, 20.0)
        assert ml.key("max_queued") == "tenants.ml.team.max_queued"
        assert ml.key("max_stored_gb") == "tenants.default.max_stored_gb"
        other = config.tenant_bounds("other")
        assert (other.max_queued, other.max_stored_gb) == (50, 20.0)

    @pytest.mark.parametrize(
        ("data", "words"),
        [
            ({"tenants": {"a": {"max_queued": -1}}}, "tenants.a.max_queued must be a whole"),
            ({"tenants": {"a": {"max_queued": 2**31}}}, "tenants.a.max_queued must be a whole"),
            ({"tenants": {"a": {"max_queued": 1.5}}}, "$.tenants[...].max_queued"),
            ({"tenants": {"default": {"max_stored_gb": -0.5}}}, "tenants.default.max_stored_gb"),
            ({"tenants": {"a": {"max_stored_gb": float("inf")}}}, "tenants.a.max_stored_gb"),
            ({"tenants": {"a": {"max_stored_gb": float("nan")}}}, "tenants.a.max_stored_gb"),
            ({"tenants": {"-a": {}}}, "tenants.-a: a tenant is"),
            ({"tenants": {"a": {"max_queue": 1}}}, "`max_queue`"),
            ({"tenants": {"a": {"max_running": -1}}}, "tenants.a.max_running must be a whole"),
            ({"tenants": {"a": {"max_gpus": 2**31}}}, "tenants.a.max_gpus must be a whole"),
            ({"pools": {"gpu": {"default_memory": "lots"}}}, "pools.gpu.default_*: memory"),
            ({"pools": {"gpu": {"default_cpus": -1}}}, "pools.gpu.default_cpus must be"),
            ({"pools": {"gpu": {"default_gpus": -2}}}, "pools.gpu.default_gpus must be"),
            ({"cas": {"max_blob_gb": 0}}, "cas.max_blob_gb must be a finite number above 0"),
            ({"cas": {"max_blob_gb": float("inf")}}, "cas.max_blob_gb"),
            ({"executor": {"relay_max_save_gb": -1}}, "executor.relay_max_save_gb"),
            ({"executor": {"relay_max_save_gb": float("nan")}}, "executor.relay_max_save_gb"),
            ({"executor": {"relay_max_in_flight": 0}}, "executor.relay_max_in_flight"),
            ({"executor": {"relay_max_in_flight": 1.5}}, "$.executor.relay_max_in_flight"),
        ],
    )
    def test_bad_values_are_refused_naming_the_key(self, absent, data, words):
        """A bound that is negative, not finite, fractional where whole, or unknown is refused
        with a message naming its key."""
        with pytest.raises(Invalid) as info:
            load(absent, environ=overlay(data))
        assert words in info.value.message

    def test_zero_is_a_bound_where_it_means_one(self, absent):
        """max_queued = 0 (a tenant may queue nothing) and relay_max_save_gb = 0 load."""
        config = load(
            absent,
            environ=overlay(
                {"tenants": {"a": {"max_queued": 0}}, "executor": {"relay_max_save_gb": 0}}
            ),
        )
        assert config.tenant_bounds("a").max_queued == 0
        assert config.executor.relay_max_save_gb == 0.0
