"""A job's inputs and outputs, through the installation's artifact store.

Inputs are fetched into the job's folder before it starts (a directory arrives as one
deterministic tar and is unpacked), then handed to the job's uid. Outputs are the files the job
left under $BERTH_OUTPUT, uploaded when it ends, whatever its outcome.

Security: the worker reads a job's outputs as root, and the job chose what is there. The walk
opens every folder and file relative to its parent with O_NOFOLLOW, so a symlink (to
`admin.token`, say) is never followed, and it takes only regular files owned by the job's uid
(the kernel's protected_hardlinks stops a job from linking in a file it cannot read itself).
"""

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from service import protocol
from service.cas import tree
from service.cas.base import Store, get_file, put_open
from service.cas.http import HttpStore


def for_job(store: Store | None, lease: protocol.Lease, what: str = "output") -> Store | None:
    """The store as a job's writes should reach it: its outputs, or (`upload`) its saves.

    Through a server, a write names the job and its epoch, so the server references the blob
    for the job's tenant while the lease is live: a tenant-bound worker may not write blobs its
    tenants do not hold otherwise, and the server trusts its outputs only as written this way.
    Outputs and saves are told apart: a job's outputs are what its result lists.
    """
    if isinstance(store, HttpStore):
        return store.writing_with({"job": lease.job, "epoch": lease.epoch, "what": what})
    return store


async def fetch_inputs(store: Store, inputs: tuple[protocol.Input, ...], workdir: Path) -> None:
    """Every input into `workdir` under its name (directories unpacked); raise on a bad one."""
    for item in inputs:
        name = Path(item.name).name  # a base name only: never a path out of the folder
        if name in ("", ".", ".."):
            raise ValueError(f"input name {item.name!r} is not a file name")
        target = workdir / name
        if item.kind == "dir":
            tar = workdir / f".{name}.tar"  # a whole tar first: it is checked before unpacking
            try:
                await get_file(store, item.sha256, tar)
                await tree.unpack(tar, target)
            finally:
                tar.unlink(missing_ok=True)
        else:
            await get_file(store, item.sha256, target)


def hand_over(path: Path, uid: int, gid: int) -> None:
    """Give `path` (and everything under it) to the job's user, without following links."""
    os.chown(path, uid, gid, follow_symlinks=False)
    if path.is_dir() and not path.is_symlink():
        for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
            for name in dirnames + filenames:
                os.chown(Path(dirpath) / name, uid, gid, follow_symlinks=False)


def _walk(dir_fd: int, prefix: str, uid: int) -> Iterator[tuple[str, int]]:
    """(relative path, an fd open for reading) of each regular file the job owns, no links."""
    for entry in sorted(os.listdir(dir_fd)):
        try:
            st = os.stat(entry, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if st.st_uid != uid:
            continue
        rel = f"{prefix}{entry}"
        if stat.S_ISDIR(st.st_mode):
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
            try:
                sub = os.open(entry, flags, dir_fd=dir_fd)
            except OSError:
                continue
            try:
                yield from _walk(sub, rel + "/", uid)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            # The job (or what it left running) may swap the file between the stat and the
            # open: O_NONBLOCK keeps a FIFO put in its place from blocking this worker, and the
            # opened file itself is checked again.
            try:
                fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError:
                continue
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or opened.st_uid != uid:
                os.close(fd)
                continue
            os.set_blocking(fd, True)
            yield rel, fd


async def upload_outputs(store: Store, outdir: Path, uid: int) -> list[protocol.Artifact]:
    """Upload what the job left under `outdir`; the list to report with its result."""
    try:
        root = os.open(outdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return []  # the job removed (or replaced) its output folder: nothing to keep
    found: list[protocol.Artifact] = []
    try:
        for rel, fd in _walk(root, "", uid):
            with os.fdopen(fd, "rb") as f:
                sha, size = await put_open(store, f)
            found.append(protocol.Artifact(path=rel, sha256=sha, size=size))
            if len(found) >= protocol.MAX_OUTPUTS:
                break
    finally:
        os.close(root)
    return found
