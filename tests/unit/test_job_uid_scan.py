"""The scan kill_all relies on: which uids have live processes, read from /proc."""

import os
import signal
import subprocess
import time

from service.worker import jobusers

UID = 64999  # a uid no process of this machine runs as


def _spawn_as(uid: int) -> subprocess.Popen[bytes]:
    # preexec_fn as the worker does it (jobusers.become): no threads run in this test.
    return subprocess.Popen(["sleep", "30"], preexec_fn=jobusers.become(uid, uid))  # noqa: PLW1509


def _wait_for(cond, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_a_live_process_of_the_uid_is_seen_and_a_zombie_or_a_reaped_one_is_not():
    assert os.geteuid() == 0, "the worker's job uids need root (CI runs as root)"
    assert not jobusers._runs_as(UID)
    proc = _spawn_as(UID)
    try:
        assert _wait_for(lambda: jobusers._runs_as(UID))
        assert UID in set(jobusers._uids()) and 0 in set(jobusers._uids())
        os.kill(proc.pid, signal.SIGKILL)
        # Dead but not yet waited for: a zombie, which runs nothing.
        assert _wait_for(lambda: not jobusers._runs_as(UID))
        with open(f"/proc/{proc.pid}/status", "rb") as f:  # noqa: PTH123
            assert b"State:\tZ" in f.read()
    finally:
        proc.kill()
        proc.wait()
    assert not jobusers._runs_as(UID)


def test_a_process_that_made_itself_undumpable_is_still_seen():
    """A job that clears its dumpable flag may hide the owner of its /proc files (they turn
    root's), never the status file's Uid line, which the scan reads."""
    assert os.geteuid() == 0
    code = (
        "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); "  # PR_SET_DUMPABLE 0
        "import sys; d = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0); "  # PR_GET_DUMPABLE
        "sys.stdout.write(f'ready {d}\\n'); sys.stdout.flush(); time.sleep(30)"
    )
    proc = subprocess.Popen(
        ["/usr/bin/python3", "-c", code],
        preexec_fn=jobusers.become(UID, UID),  # noqa: PLW1509
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready 0\n"
        assert jobusers._runs_as(UID)
    finally:
        proc.kill()
        proc.wait()
