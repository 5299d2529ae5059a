"""Where jobs' working directories live: outside the worker's (and the server's) home.

The worker's home holds its credential and state and is 0700, so a job running as another uid
could not even reach a folder inside it. Jobs' folders live under a work root instead, which
is 0711 (anyone may pass through to their own folder, nobody may list the others) and owned by
the worker's user; each job's folder in it is 0700 and owned by the job's user. The work root
is per worker (named by a digest of its home), and a worker starting up empties it: folders
left there by a worker that was killed belong to jobs that are dead.

As root the work root's parent is /var/lib/berth/work: never under /tmp or /var/tmp, which each
job gets a private one of (worker/isolation.py), so its folder would not be where its $HOME says.
"""

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path


class UnsafeWorkDir(Exception):
    """The work root exists but someone else could tamper with it."""


ROOT_PARENT = Path("/var/lib/berth/work")


def default_parent() -> Path:
    if os.geteuid() == 0:
        return ROOT_PARENT
    return Path(tempfile.gettempdir()) / f"berth-work-{os.geteuid()}"


def install_runtime(root: Path) -> Path:
    """The in-job runtime (`berth_runtime`, stdlib only) and its `berth` command.

    Readable by every job: `root/runtime` goes on a job's PYTHONPATH, `root/runtime/bin` on
    its PATH.
    """
    import berth_runtime  # noqa: PLC0415  (only its files are needed, not its code)

    source = Path(berth_runtime.__file__).parent
    target = root / "runtime"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source / "bin", target / "bin")
    shutil.copytree(
        source, target / "berth_runtime", ignore=shutil.ignore_patterns("bin", "__pycache__")
    )
    for dirpath, dirnames, filenames in os.walk(target):
        os.chmod(dirpath, 0o755)  # noqa: PTH101, S103  (a job of any uid reads it)
        for name in filenames:
            mode = 0o755 if Path(dirpath).name == "bin" else 0o644
            os.chmod(Path(dirpath) / name, mode)  # noqa: PTH101
        dirnames.sort()
    return target


def prepare(home: Path, parent: Path | None = None) -> Path:
    """This worker's work root, made safe and empty; raise UnsafeWorkDir when it is not ours."""
    if parent is None:
        parent = default_parent()
        if parent == ROOT_PARENT:
            _root_only(parent.parent)
    _own_dir(parent)
    root = parent / hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:16]
    _own_dir(root)
    for leftover in root.iterdir():
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    install_runtime(root)
    return root


def _root_only(path: Path) -> None:
    """/var/lib/berth: made 0755 if missing; refused when someone else could swap what is in it."""
    path.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise UnsafeWorkDir(
            f"{path} is not a folder of root that only root may write to; "
            "fix it or give the worker another --work-dir"
        )


def _own_dir(path: Path) -> None:
    """Make `path` (0711, ours) or check that an existing one is ours and not writable by others.

    /var/tmp and /tmp are writable by everyone: a folder someone else made first (or a symlink
    planted there) would let them swap a job's folder under it.
    """
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o711)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise UnsafeWorkDir(
            f"{path} is not a folder of this user that only it may write to; "
            "remove it or give the worker another --work-dir"
        )
    # Pass-through only: a job reaches its own folder, and lists nobody's.
    os.chmod(path, 0o711)  # noqa: PTH101, S103  (lstat-checked above: not a symlink)
