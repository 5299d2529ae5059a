"""The job's group leader: kills the whole group when the worker dies, even by kill -9.

Usage: python -m service.worker.shim FD -- ARGV...
FD is the read end of a pipe whose write end only the worker holds. When the worker process
ends for any reason, the kernel closes that end, the read here returns EOF, and the group is
killed. Standard library only: it starts for every job.
"""

import os
import signal
import subprocess
import sys
import threading


def _watch(fd: int) -> None:
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the worker is gone: nothing of the job survives it


def main() -> int:
    fd = int(sys.argv[1])
    argv = sys.argv[sys.argv.index("--") + 1 :]
    threading.Thread(target=_watch, args=(fd,), daemon=True).start()
    try:
        child = subprocess.Popen(argv)
    except OSError as exc:
        sys.stderr.write(f"berth: cannot run {argv[0]!r}: {exc.strerror}\n")
        return 127
    # TERM is for the job: the worker signals the whole group, and the shim stays to report
    # the job's exit. Ignored only after the child started, since exec keeps ignored signals.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
