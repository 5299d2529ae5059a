"""The fallback when jobs get no namespaces (worker/leftovers.py, jobusers.Users in cleanup mode):
what a uid left in /tmp, /var/tmp, /dev/shm and SysV IPC is removed, and nothing else is, on the
real folders, as root. And the job's accounts (worker/accounts.py)."""

import os
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.worker import accounts, leftovers
from service.worker.jobusers import Users, become

UID, OTHER, SPARE = 64951, 64952, 64953  # outside berth's default range: no job runs as them
ROOTS = ("/tmp", "/var/tmp", "/dev/shm")
OUTSIDE = Path("/var/lib/berth-test")


def make(path: Path, uid: int, *, folder: bool = False) -> Path:
    if folder:
        path.mkdir()
    else:
        path.write_text("x")
    os.lchown(path, uid, uid)
    return path


def link(path: Path, target: Path, uid: int) -> Path:
    path.symlink_to(target)
    os.lchown(path, uid, uid)
    return path


def shm_ids(uid: int) -> list[int]:
    return [i for i, owner, creator in leftovers._sysv_rows("shm") if uid in (owner, creator)]


def make_shm(uid: int) -> None:
    subprocess.run(
        ["ipcmk", "-M", "4096"], preexec_fn=become(uid, uid), check=True, capture_output=True
    )


@pytest.fixture
def tag() -> Iterator[str]:
    """A unique prefix for this test's entries in the shared folders; removed after it."""
    tag = f"berth-leftovers-{uuid.uuid4().hex[:8]}"
    yield tag
    leftovers.purge([UID, OTHER, SPARE], roots=ROOTS)
    for root in ROOTS:
        for path in Path(root).iterdir():
            if path.name.startswith(tag):
                subprocess.run(["rm", "-rf", str(path)], check=False)


class TestPurge:
    def test_removes_only_what_the_uid_owns(self, tag):
        """Files, links and folder trees of the uid go from all three folders; another uid's
        files stay, even inside the uid's folder, and its own folder keeps the uid's files out."""
        OUTSIDE.mkdir(exist_ok=True)
        kept: list[Path] = []
        gone: list[Path] = []
        for root in map(Path, ROOTS):
            gone.append(make(root / f"{tag}-file", UID))
            tree = make(root / f"{tag}-tree", UID, folder=True)
            make(tree / "sub", UID, folder=True)
            gone += [tree, tree / "sub", make(tree / "sub" / "f", UID)]
            kept.append(make(root / f"{tag}-other", OTHER))
            theirs = make(root / f"{tag}-theirs", OTHER, folder=True)
            theirs.chmod(0o777)
            kept.append(theirs)
            gone.append(make(theirs / "planted", UID))  # the uid's file in another uid's folder
            mixed = make(root / f"{tag}-mixed", UID, folder=True)
            mixed.chmod(0o777)
            kept.append(make(mixed / "guest", OTHER))
        removed = leftovers.purge([UID], roots=ROOTS)
        assert removed >= len(gone)
        assert [p for p in gone if p.exists() or p.is_symlink()] == []
        assert [p for p in kept if not p.exists()] == []
        for root in ROOTS:
            mixed = Path(root, f"{tag}-mixed")
            st = mixed.stat()  # kept for its guest, but no longer the uid's
            assert (st.st_uid, bool(st.st_mode & stat.S_ISVTX)) == (0, True)

    def test_never_follows_a_link(self, tag):
        """A link of the uid is removed, never followed: what it points at (a folder of the uid
        elsewhere, another uid's file) stays."""
        OUTSIDE.mkdir(exist_ok=True)
        away = make(OUTSIDE / f"{tag}-away", UID, folder=True)
        try:
            behind = make(away / "behind", UID)
            victim = make(Path("/tmp", f"{tag}-victim"), OTHER)
            links = [
                link(Path("/tmp", f"{tag}-to-folder"), away, UID),
                link(Path("/var/tmp", f"{tag}-to-file"), victim, UID),
                link(Path("/dev/shm", f"{tag}-to-root"), Path("/"), UID),
            ]
            leftovers.purge([UID], roots=ROOTS)
            assert [p for p in links if p.is_symlink()] == []
            assert behind.exists() and victim.exists()
        finally:
            subprocess.run(["rm", "-rf", str(away)], check=True)

    def test_too_deep_is_closed_to_everyone(self, tag, monkeypatch):
        """A tree deeper than the walk goes is given to root, 0700, at that depth."""
        monkeypatch.setattr(leftovers, "MAX_DEPTH", 3)
        path = Path("/tmp", f"{tag}-deep")
        levels = [path / "/".join("d" * (i + 1)) for i in range(5)]
        make(path, UID, folder=True)
        for level in levels:
            make(level, UID, folder=True)
        leftovers.purge([UID], roots=ROOTS)
        st = levels[1].stat()  # the walk's depth 3: /tmp/<tag>-deep/d/d
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
        assert levels[-1].exists()  # not walked below it

    def test_removes_the_uids_sysv_ipc(self, tag):
        """The uid's SysV shared memory goes; another uid's stays."""
        make_shm(UID)
        make_shm(OTHER)
        assert shm_ids(UID) and shm_ids(OTHER)
        leftovers.purge([UID], roots=ROOTS)
        assert shm_ids(UID) == []
        assert shm_ids(OTHER) != []
        leftovers.purge_sysv([OTHER])


class TestUsersInCleanupMode:
    async def test_release_and_a_dead_holder(self, tag, tmp_path):
        """Release removes what the job's uid left; a uid whose holder died before releasing it
        is cleaned before it is handed out again."""
        users = Users(uid_range=(SPARE, SPARE), lock_dir=tmp_path, cleanup=True)
        user = await users.acquire()
        assert user.uid == SPARE and user.name == accounts.name_of(SPARE)
        left = make(Path("/tmp", f"{tag}-job"), SPARE)
        await users.release(user)
        assert not left.exists()

        user = await users.acquire()
        left = make(Path("/var/tmp", f"{tag}-crash"), SPARE)
        os.close(users._locks.pop(SPARE))  # the worker dies: its lock goes, nothing cleaned
        again = await Users(uid_range=(SPARE, SPARE), lock_dir=tmp_path, cleanup=True).acquire()
        assert again.uid == SPARE
        assert not left.exists()


class TestAccounts:
    def test_job_files(self, tmp_path):
        """The job's passwd and group: the host's, with the job's uid named, home its folder."""
        (tmp_path / "passwd").write_text(
            "root:x:0:0:root:/root:/bin/bash\nold:x:61001:5::/:/bin/sh\n"
        )
        (tmp_path / "group").write_text("root:x:0:\n")
        passwd, group = accounts.for_job(
            uid=61001, gid=61001, name="berth-job-61001", home=Path("/w/1-1"), etc=tmp_path
        )
        assert passwd.decode().splitlines() == [
            "root:x:0:0:root:/root:/bin/bash",
            "berth-job-61001:x:61001:61001:berth job:/w/1-1:/bin/sh",
        ]
        assert group.decode().splitlines() == ["root:x:0:", "berth-job-61001:x:61001:"]

    def test_added_to_the_host_once(self, tmp_path):
        """Without namespaces, the range's uids that have no entry get one, once."""
        (tmp_path / "passwd").write_text(
            "root:x:0:0:root:/root:/bin/bash\nbob:x:61001:61001::/:/bin/sh"
        )
        (tmp_path / "group").write_text("root:x:0:\n")
        assert accounts.add_to_host([61000, 61001, 61002], etc=tmp_path) == 2
        assert accounts.add_to_host([61000, 61001, 61002], etc=tmp_path) == 0
        lines = (tmp_path / "passwd").read_text().splitlines()
        assert lines[1:] == [
            "bob:x:61001:61001::/:/bin/sh",
            "berth-job-61000:x:61000:61000:berth job:/nonexistent:/usr/sbin/nologin",
            "berth-job-61002:x:61002:61002:berth job:/nonexistent:/usr/sbin/nologin",
        ]
        assert (tmp_path / "group").read_text().splitlines()[1:] == [
            "berth-job-61000:x:61000:",
            "berth-job-61002:x:61002:",
        ]
