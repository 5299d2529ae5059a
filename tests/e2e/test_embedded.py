"""The embedded default: `berth serve` with no database URL brings its own Postgres."""

import signal
import stat

import psutil

from tests.procs import Server


def postgres_of(pgdata: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        try:
            if p.info["name"] == "postgres" and pgdata in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


class TestEmbedded:
    def test_serve_on_embedded_postgres(self, tmp_path):
        """No URL: Postgres starts under $BERTH_HOME/postgres, jobs run, SIGTERM stops both."""
        s = Server(home=tmp_path / "home", db_url=None).start(timeout=120)
        try:
            token_file = s.home / "admin.token"
            assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
            assert (s.home / "postgres" / "PG_VERSION").exists()
            assert postgres_of(str(s.home / "postgres"))
            r = s.cli("job", "submit", "--wait", "--", "echo", "hello")
            assert (r.code, r.out) == (0, "hello\n"), r.err + s.log()
            assert s.cli("job", "submit", "--wait", "--", "sh", "-c", "exit 3").code == 3
        finally:
            s.kill(signal.SIGTERM)
        assert s.proc is not None and s.proc.returncode == 0, s.log()
        assert not postgres_of(str(s.home / "postgres")), "embedded Postgres left running"
        # A second start reuses the data and keeps the admin token.
        again = Server(home=tmp_path / "home", db_url=None).start(timeout=120)
        try:
            assert again.cli("job", "list", "--json").code == 0
        finally:
            again.kill(signal.SIGTERM)
