"""Nothing survives a job under its uid, and a job gets a usable system (SPEC section 4), with
real processes as root.

A uid runs one job after another, often of different tenants: what one job leaves in /tmp,
/var/tmp, /dev/shm or SysV IPC must not reach the next job of its uid. With namespaces each job
has its own; a worker that cannot make them (no CAP_SYS_ADMIN: run here under setpriv) removes
what the uid left before it runs again. Either way the job's uid has a name and the job's PATH
is the system's.
"""

import contextlib
import fcntl
import os
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.e2e.test_trust import attached, finished, output, submit, uid_of
from tests.procs import wait_for

POOL = {"pools": {"gpu": {"slots": {"default": 1}}}}
UID = 61750
# A root worker that cannot make namespaces, as in a container without CAP_SYS_ADMIN.
NO_SYS_ADMIN = ("setpriv", "--bounding-set", "-sys_admin", "--")
MODES = {"namespace": (), "cleanup": NO_SYS_ADMIN}


@contextlib.contextmanager
def host_accounts_restored():
    """The worker in cleanup mode names its uids in /etc/passwd and group: undo it after."""
    before = {name: Path("/etc", name).read_text() for name in ("passwd", "group")}
    try:
        yield
    finally:
        lock = os.open("/etc/.pwd.lock", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX)
            for name, text in before.items():
                path = Path("/etc", name)
                now = path.read_text().splitlines(keepends=True)
                kept = [
                    line for line in now if not line.startswith(f"berth-job-{UID}:") or line in text
                ]
                if kept != now:  # replaced whole: a reader never sees it half written
                    staged = path.with_name(f"{name}.berth-test")
                    staged.write_text("".join(kept))
                    staged.chmod(path.stat().st_mode & 0o777)
                    staged.replace(path)
        finally:
            os.close(lock)


def sysv_shm_of(text: str, uid: int) -> list[str]:
    """The rows of /proc/sysvipc/shm (as printed by a job) owned or created by `uid`."""
    lines = text.split("== sysvipc\n", 1)[1].split("== ", 1)[0].splitlines()
    header, rows = lines[0].split(), lines[1:]
    at_uid, at_cuid = header.index("uid"), header.index("cuid")
    return [r for r in rows if str(uid) in (r.split()[at_uid], r.split()[at_cuid])]


class TestNothingSurvivesUnderItsUid:
    @pytest.mark.parametrize("mode", list(MODES))
    def test_next_job_of_the_uid_sees_nothing(self, server_factory, worker_factory, mode):
        """Tenant b's job leaves files, a folder tree, a link and a SysV segment in /tmp,
        /var/tmp and /dev/shm; tenant a's next job under the same uid finds none of them and
        uses /tmp as usual."""
        s = server_factory(POOL, builtin_worker=False)
        with host_accounts_restored():
            w = worker_factory(
                s, s.worker_token("gpu1"), "gpu", "--uid-range", f"{UID}-{UID}",
                prefix=MODES[mode],
            )  # fmt: skip
            wait_for(lambda: attached(s, "gpu1"), 20, "gpu1 attached")
            mark = f"left-by-b-{uuid.uuid4().hex[:8]}"
            b_script = textwrap.dedent(
                f"""
                set -e
                echo "uid=$(id -u)"
                for d in /tmp /var/tmp /dev/shm; do echo b > "$d/{mark}"; done
                mkdir -p /tmp/{mark}-tree/sub && echo b > /tmp/{mark}-tree/sub/f
                ln -s /etc/hostname /tmp/{mark}-link
                command -v ipcmk && ipcmk -M 4096
                ls -A /tmp /var/tmp /dev/shm
                """
            )
            b = submit(s, {"command": ["sh", "-c", b_script], "pool": "gpu", "tenant": "b"})
            assert finished(s, b)["state"] == "succeeded", output(s, b)
            b_out = output(s, b).decode()
            assert b_out.count(mark) >= 5, b_out  # its leftovers were there while it ran
            assert "Shared memory id:" in b_out, b_out

            a_script = textwrap.dedent(
                f"""
                echo "uid=$(id -u)"
                echo "name=$(id -un)"
                echo "== ls"; ls -A /tmp /var/tmp /dev/shm
                echo "== ipcs"; ipcs -m
                echo "== sysvipc"; cat /proc/sysvipc/shm
                echo "== use"; echo a-was-here > /tmp/a-{mark} && cat /tmp/a-{mark}
                """
            )
            a = submit(s, {"command": ["sh", "-c", a_script], "pool": "gpu", "tenant": "a"})
            assert finished(s, a)["state"] == "succeeded", output(s, a)
            a_out = output(s, a).decode()
            w.stop()
        assert uid_of(a_out) == uid_of(b_out) == UID  # the same uid, one tenant after the other
        seen = a_out.split("== ls\n", 1)[1].split("== ipcs", 1)[0]
        assert mark not in seen, seen
        ipcs_rows = a_out.split("== ipcs\n", 1)[1].split("== sysvipc", 1)[0].splitlines()
        owners = [row.split()[2] for row in ipcs_rows if row.startswith("0x")]
        assert not [o for o in owners if o == str(UID) or o.startswith("berth-job")], ipcs_rows
        assert sysv_shm_of(a_out, UID) == []
        assert a_out.rstrip().endswith("== use\na-was-here")
        assert "name=berth-job-61750" in a_out
        for folder in ("/tmp", "/var/tmp", "/dev/shm"):  # nor left on the host
            assert not [p for p in Path(folder).iterdir() if mark in p.name], folder
        assert w.proc is not None
        log = w.proc.stderr.read() if w.proc.stderr else ""
        assert f"isolation between jobs of one uid: {mode}" in log, log[-3000:]


class TestAUsableSystem:
    def test_name_path_and_python(self, server_factory, worker_factory, visible_dir):
        """In a job `id -un`, `getent passwd` and $USER agree on a berth job name whose home is
        $HOME (under --work-dir, usable with $TMPDIR and $BERTH_OUTPUT), PATH is the system's
        after the runtime's (never the worker's), and a plain python3 runs."""
        s = server_factory(POOL, builtin_worker=False)
        worker_path = f"/root/.not-for-jobs/shims:{os.environ['PATH']}"
        work = visible_dir / "work"
        worker_factory(
            s, s.worker_token("gpu1"), "gpu", "--work-dir", str(work), env={"PATH": worker_path}
        )
        wait_for(lambda: attached(s, "gpu1"), 20, "gpu1 attached")
        script = textwrap.dedent(
            """
            set -e
            cd "$HOME" && touch "$TMPDIR/t" "$BERTH_OUTPUT/o"
            echo "name=$(id -un)"
            echo "user=$USER"
            echo "home=$HOME"
            echo "entry=$(getent passwd "$(id -u)")"
            echo "group=$(id -gn)"
            echo "path=$PATH"
            python3 -c 'print(1)'
            """
        )
        j = submit(s, {"command": ["sh", "-c", script], "pool": "gpu"})
        assert finished(s, j)["state"] == "succeeded", output(s, j)
        out = output(s, j).decode()
        got = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        assert got["name"].startswith("berth-job-") and got["name"] == got["user"]
        assert got["group"] == got["name"]
        name, _, uid, _, _, home, _ = got["entry"].split(":")
        assert (name, home) == (got["name"], got["home"])
        assert home.startswith(f"{work}/") and home.endswith(f"/{j}-1")
        assert 61000 <= int(uid) <= 61999
        runtime, *system = got["path"].split(":")
        assert runtime.endswith("/runtime/bin") and system == ["/usr/local/bin", "/usr/bin", "/bin"]
        assert "/root" not in got["path"]
        assert out.splitlines()[-1] == "1"

    def test_builtin_worker(self, server_factory):
        """The built-in worker of `berth serve` (on uvloop) gives its jobs the same: a private
        /tmp and a name."""
        s = server_factory()
        mark = f"serve-job-{uuid.uuid4().hex[:8]}"
        r = s.cli(
            "job", "submit", "--wait", "--",
            "sh", "-c", f"id -un; touch /tmp/{mark} /dev/shm/{mark}; ls -A /tmp /dev/shm",
        )  # fmt: skip
        assert r.code == 0, r.err
        assert r.out.startswith("berth-job-"), r.out
        assert r.out.count(mark) == 2  # the job saw its own files
        for folder in ("/tmp", "/dev/shm"):
            assert not [p for p in Path(folder).iterdir() if mark in p.name], folder


class TestWorkDir:
    def test_under_tmp_is_refused(self, server_factory, worker_factory, tmp_path):
        """A --work-dir under /tmp, which each job gets a private one of, is refused in one line
        before the worker dials."""
        s = server_factory(POOL, builtin_worker=False)
        w = worker_factory(s, s.worker_token("gpu1"), "gpu", "--work-dir", str(tmp_path / "w"))
        r = w.wait(30)
        assert r.code == 2, r.err
        assert "is under /tmp, which each job gets a private one of" in r.err
        assert "Traceback" not in r.err
