"""A stand-in for `berth worker`, run by the process provider's tests in its place.

It prints its arguments, writes `$STANDIN_READY/<pid>` once its SIGTERM handler is in place (so
a test never signals it before it can answer), then waits for signals:
- SIGTERM: prints "TERM received" and exits 0, or with STANDIN_IGNORE_TERM=1 prints
  "TERM ignored" and goes on waiting (to see the provider fall back to SIGKILL);
- STANDIN_EXIT=N: exits with N at once instead (a worker that crashes on start).
"""

import os
import signal
import sys
from pathlib import Path


def main() -> None:
    print("argv", sys.argv[1:], flush=True)
    if code := os.environ.get("STANDIN_EXIT"):
        sys.exit(int(code))

    def on_term(signum: int, frame: object) -> None:
        if os.environ.get("STANDIN_IGNORE_TERM") == "1":
            print("TERM ignored", flush=True)
            return
        print("TERM received", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    if ready := os.environ.get("STANDIN_READY"):
        Path(ready, str(os.getpid())).touch()
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
