"""Closing the worker's own process to its jobs.

When jobs run as the worker's user (a worker that is not root), that user may read the
worker's `/proc/<pid>/environ` (its BERTH_TOKEN, or in the built-in worker the server's
settings) and attach a debugger to it. Marking the process not dumpable makes `/proc/<pid>/*`
root's and refuses ptrace from the same user. It does not protect the worker's files: the
worker's docs say that such jobs run with the worker's user's rights.
"""

import ctypes
import ctypes.util
import sys

PR_SET_DUMPABLE = 4


def undumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0) on Linux; False where it is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return int(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False
