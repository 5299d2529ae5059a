"""The worker needs no server dependencies: it runs with them made unimportable."""

import json
import subprocess
import sys

from tests.procs import wait_for

BLOCKED = (
    "sqlalchemy",
    "asyncpg",
    "alembic",
    "litestar",
    "uvicorn",
    "structlog",
    "authlib",
    "obstore",  # the s3 extra: a worker reaching its store over http needs none of it
)


def blocked_path(tmp_path):
    root = tmp_path / "blocked"
    for name in BLOCKED:
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(f"raise ImportError('{name} is blocked')\n")
    return root


class TestWorkerInstall:
    def test_worker_modules_import_without_server_packages(self, tmp_path):
        """`berth worker --help` and the worker modules load with server packages blocked."""
        env = {"PYTHONPATH": str(blocked_path(tmp_path)), "PATH": "/usr/bin:/bin"}
        check = subprocess.run(
            [sys.executable, "-c", "import sqlalchemy"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert check.returncode != 0 and "blocked" in check.stderr  # the block itself works
        for argv in (
            [sys.executable, "-m", "service", "worker", "--help"],
            [
                sys.executable,
                "-c",
                "import service.worker.main, service.worker.runner",
            ],
        ):
            r = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=60, check=False
            )
            assert r.returncode == 0, r.stderr

    def test_a_blocked_worker_runs_a_job(self, server_factory, tmp_path):
        """A worker process with the server packages blocked attaches and runs a job."""
        s = server_factory({"pools": {"gpu": {"slots": {"default": 1}}}})
        token = s.worker_token("lean")
        env = s.env(
            BERTH_TOKEN=token,
            BERTH_HOME=str(tmp_path / "w"),
            PYTHONPATH=str(blocked_path(tmp_path)),
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "worker", "--server", s.url, "--pool", "gpu"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            r = s.cli("job", "submit", "--wait", "--pool", "gpu", "--", "echo", "lean")
            assert (r.code, r.out) == (0, "lean\n"), r.err
            jobs = json.loads(s.cli("job", "list", "--json").out)
            assert jobs[0]["worker"] == "lean"
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        wait_for(lambda: proc.poll() is not None, 5, "worker exit")
