"""Bad input to the CLI and `berth serve`: one line on stderr and a non-zero exit, never a
traceback. The API's answers to bad input (a 4xx with a JSON body naming the problem) are
tested in process: tests/integration/test_bad_input.py."""

import subprocess
import sys


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
