"""Shared plumbing for berth's half of the benchmark: a real `berth serve` on a fresh database.

Runs with the project's own interpreter (the one berth is installed in), so unlike
``bench/benchlib.py`` it may import berth and its server dependencies. Processes are started
through ``benchlib.spawn`` (own process group, killed on exit, on SIGTERM and on the hard
timeout), so nothing outlives a run.

* :class:`BerthServer`: create and migrate a database ``bench_berth_<scenario>``, start
  ``python -m service serve --no-builtin-worker`` on a free loopback port, wait for ``/readyz``
  (the command line, environment, port and readiness wait are the tests' own, from
  ``tests/procs.py``: one process harness for both);
* worker tokens minted in bulk with berth's own token code (setup, not measurement);
* :func:`count_jobs` and friends: measurement by SQL on the same database;
* :class:`Profiler`: ``py-spy record --pid`` of the server for one phase when
  ``BENCH_PROFILE_DIR`` is set (``bench/profile.py`` sets it).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

BERTH_DIR = Path(__file__).resolve().parent
BENCH_DIR = BERTH_DIR.parent
REPO_DIR = BENCH_DIR.parent
for _p in (str(BENCH_DIR), str(REPO_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import asyncpg  # noqa: E402
import benchlib  # noqa: E402
import httpx  # noqa: E402

from tests.procs import berth_argv, berth_env, free_port, serve_argv, wait_ready  # noqa: E402

SYSTEM = "berth"

# benchlib.spawn merges os.environ under a child's env: keep any caller's BERTH_* settings
# (a token, a server, a config) out of the servers and workers this suite starts.
for _k in [k for k in os.environ if k.startswith("BERTH_")]:
    del os.environ[_k]
PROCESSES = 1  # server processes per `berth serve` (berth_bench.py --processes)
PROFILE_ENV = "BENCH_PROFILE_DIR"  # set: profile the server's measured phase with py-spy


def fresh_database(name: str) -> str:
    """Drop and recreate ``name`` and migrate it with berth's Alembic migrations; its URL."""
    url = benchlib.recreate_database(name)
    from service.db import migrate

    migrate.upgrade(url)
    return url


def raise_fd_limit(want: int = 65536) -> int:
    """Raise RLIMIT_NOFILE towards ``want`` (children inherit it); returns the soft limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass
class BerthServer:
    """One ``berth serve`` process (no built-in worker) on its own database and home."""

    scenario: str
    config: dict[str, Any] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="berth-bench-")))
    db_url: str = ""
    proc: subprocess.Popen[bytes] | None = None
    _admin: str = ""
    # `berth serve --processes N`: the bench's --processes (berth_bench.py sets it for all)
    processes: int = field(default_factory=lambda: PROCESSES)

    @property
    def database(self) -> str:
        suffix = os.environ.get("BENCH_DB_SUFFIX", "")  # tests: no clash with a running bench
        return f"bench_berth_{self.scenario.replace('-', '_')}{suffix}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return benchlib.log_dir(SYSTEM) / f"{self.scenario}-serve.log"

    def env(self, **extra: str) -> dict[str, str]:
        return berth_env(
            home=self.home, server=self.url, config=self.config, db_url=self.db_url, **extra
        )

    def start(self, timeout: float = 60.0) -> BerthServer:
        self.db_url = fresh_database(self.database)
        self.home.mkdir(parents=True, exist_ok=True)
        atexit.register(shutil.rmtree, self.home, True)
        more = ["--processes", str(self.processes)] if self.processes > 1 else []
        argv = serve_argv(self.port, builtin_worker=False, args=more)
        # benchlib.spawn, not Popen: its own process group, stopped on exit and on the timeout
        self.proc = benchlib.spawn(argv, log_path=self.log_path, cwd=REPO_DIR, env=self.env())
        wait_ready(self.proc, self.url, timeout, self.log_tail, every=0.05)
        return self

    def log_tail(self, chars: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """CPU (user + system) the server's processes have used so far, children included."""
        import psutil

        root = psutil.Process(self.pid)
        total = 0.0
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    @property
    def admin_token(self) -> str:
        if not self._admin:
            self._admin = (self.home / "admin.token").read_text().strip()
        return self._admin

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    def api(self, method: str, path: str, **kw: Any) -> Any:
        r = httpx.request(method, f"{self.url}{path}", headers=self.headers(), timeout=60, **kw)
        if r.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json()

    def stop(self) -> None:
        if self.proc is not None:
            benchlib.stop(self.proc, grace=10.0)


def worker_env(server: BerthServer, token: str, home: Path) -> dict[str, str]:
    """Environment for a real ``berth worker`` process dialling ``server``."""
    return server.env(BERTH_TOKEN=token, BERTH_HOME=str(home))


def spawn_real_worker(
    server: BerthServer, token: str, pool: str, name: str, *args: str
) -> subprocess.Popen[bytes]:
    home = server.home / f"worker-{name}"
    home.mkdir(parents=True, exist_ok=True)
    return benchlib.spawn(
        berth_argv("worker", "--server", server.url, "--pool", pool, *args),
        log_path=benchlib.log_dir(SYSTEM) / f"{server.scenario}-worker-{name}.log",
        cwd=REPO_DIR,
        env=worker_env(server, token, home),
    )


# ---------------------------------------------------------------------------------------------
# Tokens and SQL


MINT_CONNECTIONS = 4  # set-up's minting is client CPU bound: a few transactions overlap its waits


async def mint_worker_tokens(db_url: str, prefix: str, n: int) -> list[tuple[str, str]]:
    """Mint ``n`` worker tokens named ``<prefix>-00000``…; returns (name, token) pairs.

    Set-up, not measurement, through berth's own code: the name rules and the mint and digest
    of a token (``service.domain.tokens``, ``service.auth.tokens``) and the row berth writes
    for one (``service.db.queries.tokens.create``), in a few transactions on the database
    directly. Not the API: it takes one token per request and audits each, and the server
    would then seal thousands of audit entries during the measurement. 10,000 take seconds.
    """
    from service.auth import tokens as tokens_auth
    from service.auth.callers import Role
    from service.core.states import TokenKind
    from service.db.engine import Database
    from service.db.queries import tokens as tokens_q
    from service.domain import tokens as tokens_domain

    pairs = [
        (tokens_domain.check_worker_name(f"{prefix}-{i:05d}"), tokens_auth.mint()) for i in range(n)
    ]
    db = Database(db_url, pool_size=MINT_CONNECTIONS, max_overflow=0)

    async def insert(part: list[tuple[str, str]]) -> None:
        async with db.begin() as conn:
            for name, token in part:
                await tokens_q.create(
                    conn,
                    name=name,
                    kind=str(TokenKind.WORKER),
                    digest=tokens_auth.digest(token),
                    tenants=[],  # fleet-wide: serves every tenant's jobs
                    created_by="service:bench",
                    expires_days=1,
                )

    try:
        await asyncio.gather(*(insert(pairs[k::MINT_CONNECTIONS]) for k in range(MINT_CONNECTIONS)))
        # The scenarios take a token's name for its worker's (failover finds a job's holder by
        # it, the simulators report by it): check that berth agrees, at both ends of the batch.
        for name, token in pairs[:1] + pairs[-1:]:
            caller = await tokens_domain.authenticate(db, token)
            if caller.role is not Role.WORKER or caller.name != name:
                raise RuntimeError(f"token {name!r} authenticates as {caller}, not worker {name}")
    finally:
        await db.dispose()
    return pairs


def write_tokens(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{name}\t{token}\n" for name, token in pairs))
    path.chmod(0o600)
    return path


def plain(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://")


async def sql_rows(db_url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(plain(db_url))
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


async def job_states(db_url: str) -> dict[str, int]:
    rows = await sql_rows(db_url, "SELECT state, count(*) FROM jobs GROUP BY state")
    return {r[0]: int(r[1]) for r in rows}


async def wait_states(
    db_url: str, state: str, n: int, timeout: float, every: float = 0.05
) -> tuple[bool, float]:
    """Poll until ``n`` jobs are in ``state``; (reached, time.time() when seen)."""
    conn = await asyncpg.connect(plain(db_url))
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = await conn.fetchval("SELECT count(*) FROM jobs WHERE state = $1", state)
            if got >= n:
                return True, time.time()
            await asyncio.sleep(every)
        return False, time.time()
    finally:
        await conn.close()


async def attached_workers(db_url: str) -> int:
    rows = await sql_rows(db_url, "SELECT count(*) FROM workers WHERE server_id IS NOT NULL")
    return int(rows[0][0])


def postgres_version() -> str:
    try:
        return benchlib.psql("postgres", "SHOW server_version", timeout=10)
    except (subprocess.SubprocessError, OSError):
        return "unknown"


# ---------------------------------------------------------------------------------------------
# Sim worker processes


def spawn_sim(
    server: BerthServer,
    tokens_file: Path,
    *,
    label: str,
    pool: str = "sim",
    parallel: int = 0,
    extra: list[str] | None = None,
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``simworker.py`` for every token in ``tokens_file``; returns (proc, its log)."""
    log = benchlib.log_dir(SYSTEM) / f"{server.scenario}-sim-{label}.log"
    argv = [
        sys.executable,
        str(BERTH_DIR / "simworker.py"),
        "--server",
        server.url,
        "--tokens",
        str(tokens_file),
        "--pool",
        pool,
        "--parallel",
        str(parallel),
        *(extra or []),
    ]
    return benchlib.spawn(argv, log_path=log, cwd=REPO_DIR), log


def last_json(path: Path) -> dict[str, Any]:
    """The last JSON object line of a log (a child's result)."""
    with contextlib.suppress(OSError):
        for line in reversed(path.read_text(errors="replace").splitlines()):
            text = line.strip()
            if text.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    value = json.loads(text)
                    if isinstance(value, dict):
                        return value
    return {}


def wait_proc(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def interrupt(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    """SIGTERM one child (not its group) so it can write its result, then make sure it is gone."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        if not wait_proc(proc, timeout):
            benchlib.stop(proc, grace=1.0)


# ---------------------------------------------------------------------------------------------
# Profiling, for bench/profile.py


@dataclass
class Profiler:
    """``py-spy record`` of the server pid for one phase, when BENCH_PROFILE_DIR is set."""

    server: BerthServer
    name: str
    proc: subprocess.Popen[bytes] | None = None

    @property
    def out_dir(self) -> Path | None:
        value = os.environ.get(PROFILE_ENV)
        return Path(value) if value else None

    def __enter__(self) -> Self:
        out = self.out_dir
        if out is None:
            return self
        out.mkdir(parents=True, exist_ok=True)
        py_spy = Path(sys.executable).parent / "py-spy"
        exe = str(py_spy) if py_spy.exists() else "py-spy"
        self.proc = benchlib.spawn(
            [
                exe,
                "record",
                "--pid",
                str(self.server.pid),
                "--rate",
                "200",
                "--format",
                "raw",
                "--output",
                str(out / f"{self.name}.collapsed.txt"),
            ],
            log_path=out / f"{self.name}.py-spy.log",
        )
        time.sleep(0.5)  # let it attach before the phase starts
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        # SIGINT: py-spy stops sampling and writes its output.
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGINT)
        if not wait_proc(self.proc, 30.0):
            benchlib.stop(self.proc, grace=1.0)
