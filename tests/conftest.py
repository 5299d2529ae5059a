"""Fixtures: a Postgres for the run, a migrated template, a fresh database per test, and
helpers to run `berth serve` and `berth worker` as real processes."""

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest

from service.db.engine import Database
from tests import pg


@pytest.fixture(scope="session", autouse=True)
def _embedded_data_removed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """As root, an embedded Postgres keeps its data outside its home, in /var/lib/berth: the
    data of this run's homes goes with the run."""
    yield
    from service.db.embedded_access import DATA_ROOT

    for link in tmp_path_factory.getbasetemp().glob("**/postgres"):
        if link.is_symlink() and (target := link.readlink()).parent == DATA_ROOT:
            shutil.rmtree(target, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    with pg.server() as url:
        yield url


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    name = pg.make_template(pg_admin_url)
    yield name
    pg.drop_template(pg_admin_url, name)


@pytest.fixture
async def db_url(pg_admin_url: str, template_db: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test (a clone of the template)."""
    name = await pg.clone(pg_admin_url, template_db)
    yield pg.with_db(pg_admin_url, name)
    await pg.admin(pg_admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database(db_url)
    yield database
    await database.dispose()


@pytest.fixture
def sync_db_url(pg_admin_url: str, template_db: str) -> Iterator[str]:
    """db_url for plain (non-async) tests that drive processes."""
    name = asyncio.run(pg.clone(pg_admin_url, template_db))
    yield pg.with_db(pg_admin_url, name)
    asyncio.run(pg.admin(pg_admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def server_factory(tmp_path, sync_db_url):
    """Start `berth serve` processes on this test's database; all are stopped at the end."""
    from tests.procs import Server

    started: list[Server] = []

    def make(
        config: dict | None = None,
        *,
        builtin_worker: bool = True,
        name: str = "s",
        port: int | None = None,
        under: Path | None = None,
    ) -> Server:
        s = Server(
            home=(under or tmp_path) / name,
            db_url=sync_db_url,
            config=config or {},
            builtin_worker=builtin_worker,
        )
        if port is not None:
            s.port = port
        started.append(s)
        s.start()
        token = s.home / "admin.token"
        if not token.exists() and len(started) > 1:  # one database, one admin token
            token.write_text((started[0].home / "admin.token").read_text())
        return s

    yield make
    for s in started:
        s.stop()
    # Provisioned workers outlive their server by design: end this test's.
    from tests.procs import provisioned_workers

    for p in provisioned_workers(tmp_path):
        with contextlib.suppress(psutil.Error):
            p.kill()


@pytest.fixture
def worker_factory(tmp_path):
    from tests.procs import Worker

    started: list[Worker] = []

    def make(
        server,
        token: str,
        pool: str,
        *args: str,
        name: str = "w",
        env: dict | None = None,
        prefix: tuple[str, ...] = (),
        under: Path | None = None,
    ) -> Worker:
        w = Worker(
            server=server,
            token=token,
            pool=pool,
            home=(under or tmp_path) / f"worker-{name}",
            args=args,
            extra_env=env or {},
            prefix=prefix,
        )
        started.append(w)
        return w.start()

    yield make
    for w in started:
        w.stop()


SHARED_PARENT = Path("/var/lib/berth-test")


@pytest.fixture
def visible_dir() -> Iterator[Path]:
    """A folder of root's (0755) outside /tmp, /var/tmp and /dev/shm, for homes that a job must
    see and be refused (pytest's tmp_path is under /tmp, which a job gets a private one of)."""
    SHARED_PARENT.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="homes-", dir=SHARED_PARENT))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder any job may write to: jobs run as uids of their own (workers run as root here),
    and pytest's tmp_path is 0700 root. Outside /tmp, /var/tmp and /dev/shm, which each job gets
    a private one of. Sticky, so a job cannot delete another's files."""
    SHARED_PARENT.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="shared-", dir=SHARED_PARENT))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 for the session, with fake credentials in the env."""
    from moto.server import ThreadedMotoServer

    saved = {k: os.environ.get(k) for k in S3_ENV}
    os.environ.update(S3_ENV)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    """A new, empty bucket."""
    import boto3

    name = f"berth-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    client.close()
    return name
