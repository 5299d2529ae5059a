"""The job's group leader (runner.SHIM): exit codes pass through, and the worker's death kills
the whole group, whatever file descriptor number the lifeline pipe has."""

import os
import subprocess
import time

import psutil

from service.worker.runner import SHIM


def spawn(argv: list[str], lifeline: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["/bin/sh", "-c", SHIM, "berth-job", *argv],
        stdin=lifeline,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def alive_in_group(pgid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return found


class TestShim:
    def test_exit_code_and_output_pass_through(self):
        """The job's exit code is the shim's, its stdin is empty, and the shim says nothing."""
        r, w = os.pipe()
        try:
            p = spawn(["sh", "-c", "cat; echo out; echo err >&2; exit 7"], r)
            out, err = p.communicate(timeout=10)
        finally:
            os.close(r)
            os.close(w)
        assert (p.returncode, out, err) == (7, "out\n", "err\n")

    def test_worker_death_kills_the_group_with_a_high_fd(self):
        """Closing the lifeline (as the kernel does when the worker dies) kills every process."""
        spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(20)]  # push the pipe past fd 9
        r, w = os.pipe()
        assert r > 9
        try:
            p = spawn(["sh", "-c", "sleep 300 & sleep 300"], r)
            os.close(r)
            deadline = time.monotonic() + 5
            while len(alive_in_group(p.pid)) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(alive_in_group(p.pid)) >= 3  # shim, sh, two sleeps (+ watcher)
            os.close(w)
            p.wait(timeout=10)
            deadline = time.monotonic() + 5
            while alive_in_group(p.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert alive_in_group(p.pid) == []
        finally:
            for fd in spare:
                os.close(fd)
