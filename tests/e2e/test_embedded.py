"""The embedded default: `berth serve` with no database URL brings its own Postgres."""

import shutil
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
    def test_serve_on_embedded_postgres(self, visible_dir):
        """No URL: Postgres starts under $BERTH_HOME/postgres, jobs run, SIGTERM stops both."""
        # Outside /tmp: a job sees the home there (as ~/.berth) and must be refused, not miss it.
        s = Server(home=visible_dir / "home", db_url=None).start(timeout=120)
        try:
            token_file = s.home / "admin.token"
            assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
            assert (s.home / "postgres" / "PG_VERSION").exists()
            assert postgres_of(str(s.home / "postgres"))
            r = s.cli("job", "submit", "--wait", "--", "echo", "hello")
            assert (r.code, r.out) == (0, "hello\n"), r.err + s.log()
            assert s.cli("job", "submit", "--wait", "--", "sh", "-c", "exit 3").code == 3
            self._jobs_cannot_reach_the_database(s)
        finally:
            s.kill(signal.SIGTERM)
        assert s.proc is not None and s.proc.returncode == 0, s.log()
        assert not postgres_of(str(s.home / "postgres")), "embedded Postgres left running"
        # A second start reuses the data and keeps the admin token.
        again = Server(home=visible_dir / "home", db_url=None).start(timeout=120)
        try:
            assert again.cli("job", "list", "--json").code == 0
        finally:
            again.kill(signal.SIGTERM)

    @staticmethod
    def _jobs_cannot_reach_the_database(s: Server) -> None:
        """A job of the built-in worker reaches neither the embedded Postgres' files nor its
        socket (which trusts whoever reaches it), nor admin.token or secret.key."""
        pid_lines = (s.home / "postgres" / "postmaster.pid").read_text().splitlines()
        socket_dir = pid_lines[4]  # postmaster.pid: line 5 is the socket directory
        psql = shutil.which("psql") or "psql"
        script = (
            f'{psql} -h "$1" -U postgres -d berth -Atc "select 4242" 2>&1; '
            'for f in "$2/admin.token" "$2/secret.key" "$2/postgres/PG_VERSION"; do '
            'cat "$f" 2>&1; done; ls "$2" 2>&1; echo end'
        )
        r = s.cli("job", "submit", "--wait", "--", "sh", "-c", script, "x", socket_dir, str(s.home))
        assert r.code == 0, r.err
        assert "4242" not in r.out and s.token not in r.out
        assert "psql: error" in r.out or "could not connect" in r.out, r.out  # psql ran, refused
        assert (s.home / "secret.key").read_text().strip() not in r.out
        assert r.out.count("Permission denied") >= 4, r.out
        assert stat.S_IMODE(s.home.stat().st_mode) in (0o700, 0o710)
