"""`berth serve --processes N`: N real server processes on one port and one database."""

import signal
import subprocess
import sys

import httpx
import psutil

from tests.procs import Server, wait_for


def _server_ids(s: Server, want: int, tries: int = 400) -> set[str]:
    """Server ids answering /api/v1/status, each request on a connection of its own (the
    kernel picks the process per connection)."""
    seen: set[str] = set()
    headers = {"Authorization": f"Bearer {s.token}"}
    for _ in range(tries):
        with httpx.Client(base_url=s.url, headers=headers, timeout=30) as client:
            r = client.get("/api/v1/status")
        assert r.status_code == 200, r.text
        seen.add(r.json()["server"]["id"])
        if len(seen) >= want:
            break
    return seen


def test_two_processes_share_the_port_and_both_serve(tmp_path, sync_db_url):
    s = Server(home=tmp_path / "home", db_url=sync_db_url, args=("--processes", "2"))
    s.start()
    try:
        assert s.proc is not None
        parent = psutil.Process(s.proc.pid)
        servers = wait_for(
            lambda: len(c := parent.children()) == 2 and c, 60, "two server processes"
        )
        # Both answer on the one port: two distinct server ids behind it.
        assert len(_server_ids(s, 2)) == 2, s.log()
        # A job submitted to either process runs on the first one's built-in worker (the
        # other wakes it through NOTIFY); each CLI call is a connection of its own.
        for i in range(4):
            r = s.cli("job", "submit", "--wait", "--", "echo", f"job{i}")
            assert (r.code, r.out) == (0, f"job{i}\n"), r.err
        # One built-in worker for the command, not one per process.
        workers = s.api("GET", "/api/v1/workers").json()
        assert [w["name"].startswith("serve-") for w in workers].count(True) == 1
        assert (s.home / "server.url").read_text().strip() == s.url
        # TERM to the parent stops every server, and the first removes server.url.
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=90) == 0
        for p in servers:
            wait_for(lambda p=p: not p.is_running() or p.status() == "zombie", 30, "a server")
        assert not (s.home / "server.url").exists()
    finally:
        s.stop()


def test_a_server_that_dies_stops_the_others(tmp_path, sync_db_url):
    s = Server(
        home=tmp_path / "home",
        db_url=sync_db_url,
        builtin_worker=False,
        args=("--processes", "2"),
    )
    s.start()
    try:
        assert s.proc is not None
        parent = psutil.Process(s.proc.pid)
        first, second = wait_for(
            lambda: len(c := parent.children()) == 2 and c, 60, "two server processes"
        )
        second.kill()
        assert s.proc.wait(timeout=90) != 0
        wait_for(lambda: not first.is_running() or first.status() == "zombie", 30, "the first")
    finally:
        s.stop()


def test_processes_must_be_a_positive_number():
    r = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--processes", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 201
    assert r.stderr.strip().splitlines() == [
        "berth: error: argument --processes: takes a whole number of 1 or more, not '0'"
    ]
