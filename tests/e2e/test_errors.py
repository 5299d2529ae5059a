"""Errors that surface (docs/architecture.md, Errors): a leader loop that keeps failing with a
bug stops `berth serve`, non-zero, with the traceback in its log.

The bug is injected through a seam that exists anyway: a provider's client library is imported
only when a pool uses it, so a stand-in `modal` package first on PYTHONPATH is what the modal
provider calls. Its lookup has a bug in it (ZeroDivisionError), as a library whose API changed
under berth would; every provisioning pass meets it.
"""

import subprocess
import sys
from pathlib import Path

from tests.procs import Server

ROOT = Path(__file__).resolve().parents[2]

BROKEN_MODAL = '''"""A stand-in for the modal client library whose App.lookup has a bug (a test's)."""


class exception:  # noqa: N801  (modal's own spelling)
    class Error(Exception):
        pass

    class AlreadyExistsError(Error):
        pass


class _Lookup:
    async def aio(self, *args, **kwargs):
        return 1 / 0  # the injected bug


class App:
    lookup = _Lookup()
'''

CONFIG = {
    "network": {"url": "http://127.0.0.1:1"},
    "executor": {"loop_seconds": 0.1, "loop_max_failures": 2},
    "pools": {
        "gpu": {
            "slots": {"default": 1},
            "provisioner": {"max": 1, "compute": {"provider": "modal", "image": "berth:test"}},
        }
    },
}


def test_a_loop_with_a_bug_stops_the_server_with_its_traceback(tmp_path, sync_db_url):
    """The provisioning loop fails two passes in a row (executor.loop_max_failures = 2): the
    server stops on its own with exit code 200 (a bug in berth), one line on stderr saying so,
    and each failed pass logged with its traceback; it does not step down and retry forever."""
    library = tmp_path / "library"
    (library / "modal").mkdir(parents=True)
    (library / "modal" / "__init__.py").write_text(BROKEN_MODAL)
    s = Server(home=tmp_path / "s", db_url=sync_db_url, config=CONFIG, builtin_worker=False)
    s.home.mkdir()
    env = s.env(PYTHONPATH=f"{library}:{ROOT}")
    done = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--listen", f"127.0.0.1:{s.port}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    log = done.stderr
    assert done.returncode == 200, log[-4000:]
    assert log.count("loop_pass_crashed") == 2, log[-4000:]
    assert "Traceback (most recent call last)" in log
    assert "ZeroDivisionError: division by zero" in log
    assert "return 1 / 0  # the injected bug" in log  # the traceback reaches the bug's line
    last = log.strip().splitlines()[-1]
    assert last.startswith("berth: error: the server stopped: the provision loop failed 2"), last
    assert "leader_stepped_down" not in log
