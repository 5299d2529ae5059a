"""The rest of the CLI contract: detach, listings with --json, status, pools, tokens."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.procs import FAST, Server, free_port, wait_for


def running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


class TestCli:
    def test_listings_and_status(self, server_factory):
        """pool list, status, token list and worker list answer in text and in --json."""
        s = server_factory({"pools": {"gpu": {"slots": {"agent": 2, "eval": 1}, "max_load": 30}}})
        pools = json.loads(s.cli("pool", "list", "--json").out)
        assert {p["name"] for p in pools} == {"serve", "gpu"}
        gpu = next(p for p in pools if p["name"] == "gpu")
        assert gpu["slots"] == {"agent": 2, "eval": 1} and gpu["max_load"] == 30
        assert "gpu" in s.cli("pool", "list").out
        s.cli("job", "submit", "--pool", "gpu", "--kind", "eval", "--", "true")
        status = s.cli("status")
        assert status.code == 0 and "1 eval job(s) for gpu" in status.out
        assert json.loads(s.cli("status", "--json").out)["queued"] == [
            {"pool": "gpu", "kind": "eval", "jobs": 1}
        ]
        tokens = json.loads(s.cli("token", "list", "--json").out)
        names = {t["name"] for t in tokens}
        assert "admin" in names and any(n.startswith("serve-") for n in names)
        assert all("token" not in t and "hash" not in t for t in tokens)
        assert "NAME" in s.cli("token", "list").out

    def test_detach(self, tmp_path, sync_db_url):
        """`serve --detach` returns once ready, leaving the server running in the background."""
        home = tmp_path / "home"
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
        env.update(
            BERTH_HOME=str(home), BERTH_DATABASE_URL=sync_db_url, BERTH_CONFIG_JSON=json.dumps(FAST)
        )
        r = subprocess.run(
            [sys.executable, "-m", "service", "serve", "--detach", "--listen", f"127.0.0.1:{port}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        pid = int((home / "serve.pid").read_text())
        try:
            assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
            s = Server(home=home, db_url=sync_db_url, port=port)
            assert s.cli("job", "submit", "--wait", "--", "echo", "bg").out == "bg\n"
        finally:
            os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not running(pid), 30, "the server to stop")
