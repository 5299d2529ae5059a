"""What a person sees from the CLI: a job's moves on a terminal (quiet on a pipe), transfer
bars, and `job wait` pushed by the server's event stream, surviving a server restart."""

import signal
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from tests.e2e.test_job_events import gated
from tests.procs import Server, wait_for

POOL = {"pools": {"gpu": {"slots": {"default": 2}}}}


def spawn(s: Server, *args: str, cwd: Path | None = None) -> pexpect.spawn:
    """The CLI on a pseudo-terminal, as a person runs it."""
    return pexpect.spawn(
        sys.executable,
        ["-m", "service", *args],
        env=s.env(BERTH_TOKEN=s.token),
        dimensions=(24, 120),
        timeout=120,
        encoding="utf-8",
        cwd=str(cwd) if cwd else None,
    )


def state(s: Server, job_id: int) -> str:
    return s.api("GET", f"/api/v1/jobs/{job_id}").json()["state"]


def test_submit_wait_shows_the_moves_on_a_terminal(server_factory, worker_factory, shared_dir):
    """queued (and why) → running on the worker → how it ended, on a PTY.

    The job waits at a gate while running, so its follower sees that state whatever the load
    (a follower is told the state a job is in when it looks, not every state it passed).
    """
    s = server_factory(POOL, builtin_worker=False)
    gate = shared_dir / "gate"
    child = spawn(s, "job", "submit", "--wait", "--", *gated(gate))
    child.expect(r"berth: job (\d+) submitted")
    job_id = int(child.match.group(1))
    child.expect(rf"berth: job {job_id} queued: waiting for [^\r\n]+")
    worker_factory(s, s.worker_token("w1"), "gpu")
    child.expect(rf"berth: job {job_id} running on worker w1")
    gate.touch()
    child.expect("after")
    child.expect(rf"berth: job {job_id} failed \(exit 3\)")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3


def test_submit_wait_and_job_wait_are_quiet_on_a_pipe(server_factory):
    s = server_factory()
    r = s.cli("job", "submit", "--wait", "--", "sh", "-c", "echo hello; exit 4")
    assert (r.code, r.out) == (4, "hello\n")
    assert r.err.count("\n") <= 2 and "queued" not in r.err and "running" not in r.err, r.err
    job_id = int(r.err.split()[2])
    r = s.cli("job", "wait", str(job_id))
    assert (r.code, r.out, r.err) == (4, "", "")


def test_job_wait_shows_the_moves_on_a_terminal(server_factory, worker_factory, shared_dir):
    s = server_factory(POOL, builtin_worker=False)
    gate = shared_dir / "gate"
    job_id = s.api("POST", "/api/v1/jobs", json={"command": gated(gate)}).json()["id"]
    child = spawn(s, "job", "wait", str(job_id))
    child.expect(rf"berth: job {job_id} queued: waiting for [^\r\n]+")
    worker_factory(s, s.worker_token("w1"), "gpu")
    child.expect(rf"berth: job {job_id} running on worker w1")
    gate.touch()
    child.expect(rf"berth: job {job_id} failed \(exit 3\)")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 3
    assert "before" not in child.before  # job wait follows the moves, not the output


@pytest.mark.timeout(600)
def test_job_wait_survives_a_server_restart(server_factory, worker_factory, shared_dir):
    """A stop and a kill -9 of the server while `job wait` follows: it dials again each time
    and still sees the job's end."""
    s = server_factory(POOL, builtin_worker=False)
    worker_factory(s, s.worker_token("w1"), "gpu")
    gate = shared_dir / "gate"
    job_id = s.api("POST", "/api/v1/jobs", json={"command": gated(gate)}).json()["id"]
    wait_for(lambda: state(s, job_id) == "running", 120, "the job running")
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "job", "wait", str(job_id)],
        env=s.env(BERTH_TOKEN=s.token),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: _connected(proc.pid, s.port), 60, "job wait to follow the stream")
    assert s.proc is not None
    # A stop (SIGTERM) ends the streams instead of waiting for their jobs to end ...
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=120) == 0, s.log()
    s.start()
    wait_for(lambda: _connected(proc.pid, s.port), 120, "job wait to dial the new server")
    # ... and a kill -9 loses nothing either.
    s.kill()
    s.proc.wait()
    s.start()
    wait_for(lambda: _connected(proc.pid, s.port), 120, "job wait to dial the new server")
    gate.touch()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, (out, err, s.log())
    assert state(s, job_id) == "failed"


def _connected(pid: int, port: int) -> bool:
    import psutil

    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return False
    return any(c.raddr and c.raddr.port == port and c.status == "ESTABLISHED" for c in conns)


def test_cas_put_and_get_show_a_bar_on_a_terminal_only(server_factory, tmp_path):
    s = server_factory()
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * (5 * 4096))  # 5 MiB
    child = spawn(s, "cas", "put", str(blob))
    child.expect(r"blob\.bin[^\r\n]*\d+(\.\d+)?/5\.\d MB[^\r\n]*/s")
    child.expect(r"[0-9a-f]{64}")
    sha = child.match.group(0)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    child = spawn(s, "cas", "get", sha, str(tmp_path / "back.bin"))
    child.expect(r"back\.bin[^\r\n]*5\.\d/5\.\d MB[^\r\n]*/s")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert (tmp_path / "back.bin").read_bytes() == blob.read_bytes()

    r = s.cli("cas", "put", str(tmp_path / "back.bin"))
    assert r.code == 0 and r.out.strip() == sha and "MB" not in r.err, r.err
    r = s.cli("cas", "get", sha, str(tmp_path / "again.bin"))
    assert r.code == 0 and r.err == "", r.err
