"""Bad input: a 4xx with a JSON body naming the problem, or one line and a non-zero exit."""

import subprocess
import sys

import pytest

from tests.procs import wait_for

UNKNOWN = [
    pytest.param(
        b'{"command": ["true"], "pool": "nope"}', 404, "unknown pool 'nope'", id="unknown-pool"
    ),
    pytest.param(
        b'{"command": ["true"], "kind": "eval"}',
        409,
        "no pool has slots of kind 'eval' (kinds by pool: serve: default)",
        id="unknown-kind",
    ),
]
BAD_BODIES = [
    pytest.param(b"{not json", "malformed JSON", id="malformed"),
    pytest.param(b'{"comand": ["true"]}', "comand", id="unknown-field"),
    pytest.param(b'{"command": "true"}', "command", id="wrong-type"),
    pytest.param(
        b'{"command": ["true"], "max_attempts": "3"}', "max_attempts", id="wrong-type-int"
    ),
    pytest.param(b'{"command": []}', "exactly one of command", id="empty-command"),
    # A pool that does not exist is a 404, a kind no pool has slots of now a 409 (a limit may
    # add them): `unknown` below.
    pytest.param(b'{"command": ["true"], "env": {"1BAD": "x"}}', "1BAD", id="bad-env-name"),
    pytest.param(
        b'{"command": ["true"], "timeout_seconds": -1}', "timeout_seconds", id="negative-timeout"
    ),
    pytest.param(b"[]", "no jobs given", id="empty-batch"),
    pytest.param(b"", "JSON body is required", id="empty-body"),
]


class TestApi:
    def test_bad_bodies_are_4xx_naming_the_problem_and_change_nothing(self, server_factory):
        """Each malformed submit is a 400 with a JSON error naming the problem; no job appears."""
        s = server_factory(builtin_worker=False)
        cases = [(c.id, c.values[0], 400, c.values[1]) for c in BAD_BODIES]
        cases += [(c.id, *c.values) for c in UNKNOWN]
        for name, raw, status, words in cases:
            r = s.api(
                "POST", "/api/v1/jobs", content=raw, headers={"content-type": "application/json"}
            )
            assert r.status_code == status, (name, r.status_code, r.text)
            assert words in r.json()["error"], (name, r.json())
        assert s.api("GET", "/api/v1/jobs").json() == []

    def test_unknown_ids_and_routes(self, server_factory):
        """Unknown job ids, workers and tokens are 404s with a JSON body."""
        s = server_factory(builtin_worker=False)
        for method, path in [
            ("GET", "/api/v1/jobs/999"),
            ("GET", "/api/v1/jobs/99999999999999999999"),
            ("POST", "/api/v1/jobs/999/cancel"),
            ("GET", "/api/v1/jobs/999/logs"),
            ("POST", "/api/v1/workers/nobody/drain"),
            ("DELETE", "/api/v1/tokens/nobody"),
            ("GET", "/api/v1/nothing-here"),
        ]:
            r = s.api(method, path)
            assert r.status_code == 404, (path, r.status_code, r.text)
            assert "error" in r.json()
        r = s.api("POST", "/api/v1/workers/serve/explode")
        assert r.status_code in (400, 404) and "error" in r.json()
        r = s.api("GET", "/api/v1/jobs", params={"state": "bogus"})
        assert r.status_code == 400 and "bogus" in r.json()["error"]

    def test_credentials(self, server_factory):
        """No token, a bad token and a worker token on a user route are 401/401/403 with JSON."""
        s = server_factory(builtin_worker=False)
        import httpx

        assert httpx.get(f"{s.url}/api/v1/jobs").status_code == 401
        r = s.api("GET", "/api/v1/jobs", token="brt_" + "y" * 43)
        assert r.status_code == 401 and r.json()["error"] == "unknown token"
        worker = s.worker_token("w9")
        r = s.api("GET", "/api/v1/jobs", token=worker)
        assert r.status_code == 403 and "error" in r.json()
        assert httpx.get(f"{s.url}/healthz").json() == {"status": "ok"}
        schema = httpx.get(f"{s.url}/schema/openapi.json")
        assert schema.status_code == 200 and "/api/v1/jobs" in schema.json()["paths"]

    def test_revoked_token_stops_working_at_once(self, server_factory):
        """A token used a moment ago (and so cached) is refused right after its revocation."""
        s = server_factory(builtin_worker=False)
        r = s.api("POST", "/api/v1/tokens", json={"name": "ci", "kind": "service"})
        ci = r.json()["token"]
        assert s.api("GET", "/api/v1/jobs", token=ci).status_code == 200
        assert s.api("DELETE", "/api/v1/tokens/ci").status_code == 200
        wait_for(lambda: s.api("GET", "/api/v1/jobs", token=ci).status_code == 401, 2, "refusal")
        assert s.api("GET", "/api/v1/jobs", token=ci).json()["error"] == "token revoked"

    def test_duplicate_token_name_is_a_conflict(self, server_factory):
        """A second live token with the same name is a 409, and the first still works."""
        s = server_factory(builtin_worker=False)
        first = s.worker_token("dup")
        r = s.api("POST", "/api/v1/tokens", json={"name": "dup", "kind": "worker"})
        assert r.status_code == 409 and "name" in r.json()["error"]
        r = s.api("POST", "/api/v1/tokens", json={"name": "bad name!", "kind": "worker"})
        assert r.status_code == 400
        assert first.startswith("brt_")


class TestCli:
    def test_cli_errors_are_one_line(self, server_factory, tmp_path):
        """CLI mistakes print one line on stderr, exit non-zero, and never a traceback."""
        s = server_factory(builtin_worker=False)
        cases = [
            ("job", "submit", "--"),
            ("job", "submit", "--env", "NOEQUALS", "--", "true"),
            ("job", "submit", "--pool", "nope", "--", "true"),
            ("job", "show", "12345"),
            ("job", "show", "abc"),
            ("worker", "drain"),
            ("token", "create", "x", "--kind", "root"),
        ]
        for args in cases:
            r = s.cli(*args)
            assert r.code != 0, args
            assert "Traceback" not in r.err, (args, r.err)
            assert len(r.err.strip().splitlines()) == 1, (args, r.err)

    def test_bad_config_key_names_the_key(self, tmp_path):
        """An unknown key in berth.toml stops `berth serve` with one line naming it."""
        home = tmp_path / "home"
        home.mkdir()
        (home / "berth.toml").write_text('[network]\nlisen = "127.0.0.1:1"\n')
        r = subprocess.run(
            [sys.executable, "-m", "service", "serve", "--home", str(home)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode != 0 and "lisen" in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1

    def test_non_loopback_without_tls_is_refused(self, tmp_path):
        """Listening on a non-loopback address without tls is refused, saying why."""
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "service",
                "serve",
                "--home",
                str(tmp_path),
                "--listen",
                "0.0.0.0:8443",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode != 0 and "without TLS" in r.stderr and "Traceback" not in r.stderr

    def test_unreachable_server(self, tmp_path):
        """A client command against no server fails in one line."""
        env = {
            "BERTH_TOKEN": "brt_" + "z" * 43,
            "BERTH_SERVER": "http://127.0.0.1:9",
            "PATH": "/usr/bin",
        }
        r = subprocess.run(
            [sys.executable, "-m", "service", "job", "list"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert r.returncode != 0 and "cannot reach the server" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1

    def test_unmigrated_database_is_refused(self, pg_admin_url, tmp_path):
        """`berth serve` on an unmigrated database refuses to start and says to run db upgrade."""

        from tests import pg

        with pg.scratch(pg_admin_url, "berth_unmigrated") as url:
            env = {"BERTH_DATABASE_URL": url, "PATH": "/usr/bin", "BERTH_HOME": str(tmp_path)}
            r = subprocess.run(
                [sys.executable, "-m", "service", "serve", "--listen", "127.0.0.1:0"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert r.returncode != 0 and "berth db upgrade" in r.stderr
            assert "Traceback" not in r.stderr
