"""A folder as one deterministic tar (SPEC 4, `--input DIR`), and its safe extraction.

The same tree always gives the same bytes, so the same input is the same blob: entries in
name order within each folder (byte order of the UTF-8 names), mtime 0, uid/gid 0 without user
or group names, modes 0o755 for folders and executable files and 0o644 for other files,
symlinks stored as links, never followed. A symlink that points outside the tree (absolute, or
escaping through `..` or other links) is refused when packing, as are devices, fifos and sockets:
what `iter_tar` makes, `extract` accepts. The tar is produced in chunks of about `CHUNK` bytes,
never whole in memory; a file that changes size while it is read fails the packing.

`extract` checks every member before writing anything (no absolute names, no `..`, no links
leaving the destination, only files, folders and links), then extracts with tarfile's "data"
filter (Python >= 3.11.4) as a second guard that checks links against the real file system,
catching escapes through chains of links that the names alone do not show.
"""

import asyncio
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
from collections.abc import AsyncGenerator, Generator, Iterator
from pathlib import Path, PurePosixPath

from service.cas.files import CHUNK

_BLOCK = tarfile.BLOCKSIZE
_ALLOWED = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE)


class Unsafe(ValueError):
    """A tree or tar that cannot be packed or extracted safely; the message names the entry."""


def iter_tar(root: Path) -> Generator[bytes, None, None]:
    """The tar of `root`'s content (names relative to it), in chunks. Blocking: see `pack`."""
    real_root = root.resolve()
    pending: list[bytes] = []
    size = 0
    written = 0
    for piece in _pieces(root, real_root):
        pending.append(piece)
        size += len(piece)
        if size >= CHUNK:
            written += size
            yield b"".join(pending)
            pending, size = [], 0
    # End of archive: two zero blocks, then zeros up to a whole record, as tarfile writes it.
    end = 2 * _BLOCK
    end += -(written + size + end) % tarfile.RECORDSIZE
    pending.append(bytes(end))
    yield b"".join(pending)


async def pack(root: Path) -> AsyncGenerator[bytes, None]:
    """`iter_tar` with its disk reads in a worker thread, for `Store.put`."""
    chunks = iter_tar(root)
    try:
        while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
            yield chunk
    finally:
        chunks.close()


def extract(tar_path: Path, dest: Path) -> None:
    """Unpack a tar as the folder `dest`, which must be absent or empty; Unsafe when refused.

    The tree is built in a temporary folder beside `dest` (0700) and renamed to it once
    complete, so `dest` never holds part of a tree, even when the data filter stops one late.
    """
    with tarfile.open(tar_path, "r:") as tf:
        members = tf.getmembers()
        _check_members(members)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
        try:
            tf.extractall(tmp, members=members, filter="data")
            tmp.replace(dest)
        except tarfile.FilterError as exc:
            raise Unsafe(f"{tar_path.name}: {exc}") from exc
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)


async def unpack(tar_path: Path, dest: Path) -> None:
    """`extract` in a worker thread."""
    await asyncio.to_thread(extract, tar_path, dest)


def _pieces(root: Path, real_root: Path) -> Iterator[bytes]:
    for rel, path, st in _walk(root, ""):
        info = tarfile.TarInfo(rel)
        info.mtime = 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        if stat.S_ISLNK(st.st_mode):
            info.type = tarfile.SYMTYPE
            info.linkname = _link_target(path, rel, real_root)
            info.mode = 0o777
        elif stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
        elif stat.S_ISREG(st.st_mode):
            info.type = tarfile.REGTYPE
            info.mode = 0o755 if st.st_mode & 0o111 else 0o644
            info.size = st.st_size
        else:
            raise Unsafe(f"{rel}: not a file, folder or symlink")
        yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        if info.type == tarfile.REGTYPE:
            yield from _content(path, rel, info.size)


def _walk(folder: Path, prefix: str) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative name, path, lstat) of every entry under `folder`, depth first, sorted."""
    with os.scandir(folder) as it:
        entries = sorted(it, key=lambda e: os.fsencode(e.name))
    for entry in entries:
        rel = f"{prefix}{entry.name}"
        st = entry.stat(follow_symlinks=False)
        yield rel, Path(entry.path), st
        if stat.S_ISDIR(st.st_mode):
            yield from _walk(Path(entry.path), f"{rel}/")


def _link_target(path: Path, rel: str, real_root: Path) -> str:
    target = os.readlink(path)  # noqa: PTH115 - Path.readlink would normalise the link text
    inside = _inside(posixpath.dirname(rel), target)
    # The real path catches escapes through other links that the names alone do not show.
    try:
        real = path.resolve()
    except (RuntimeError, OSError) as exc:  # a loop of links (RuntimeError before 3.13)
        raise Unsafe(f"{rel}: symlink to {target!r} cannot be resolved: {exc}") from exc
    if not inside or (real != real_root and real_root not in real.parents):
        raise Unsafe(f"{rel}: symlink to {target!r} leaves the tree")
    return target


def _content(path: Path, rel: str, size: int) -> Iterator[bytes]:
    left = size
    with path.open("rb") as f:
        while left:
            block = f.read(min(CHUNK, left))
            if not block:
                raise Unsafe(f"{rel}: shrank while it was packed")
            left -= len(block)
            yield block
        if f.read(1):
            raise Unsafe(f"{rel}: grew while it was packed")
    if size % _BLOCK:
        yield bytes(_BLOCK - size % _BLOCK)


def _inside(folder: str, target: str) -> bool:
    """Whether `target`, relative to `folder` (both relative to the tree), stays in the tree."""
    if not target or posixpath.isabs(target):
        return False
    joined = posixpath.normpath(posixpath.join(folder, target))
    return joined != ".." and not joined.startswith("../")


def _check_members(members: list[tarfile.TarInfo]) -> None:
    """Each member alone, and the tree they make: nothing is written through a link.

    The data filter's own checks resolve paths as text, which long or chained symlinks have
    defeated (CVE-2025-4517 and kin, before Python 3.11.13); these rules need no resolving.
    A name appears once (a file after a symlink of its name would be written through it), no
    member lies under a symlink member, and a hard link names an earlier regular file that
    lies under none.
    """
    seen: set[str] = set()
    links: set[str] = set()
    files: set[str] = set()
    for member in members:
        _check_member(member)
        name = posixpath.normpath(member.name)
        if name in seen:
            raise Unsafe(f"{member.name}: appears twice")
        seen.add(name)
        if _under_link(name, links):
            raise Unsafe(f"{member.name}: lies under a symlink of the archive")
        if member.islnk():
            target = posixpath.normpath(member.linkname)
            if target not in files or _under_link(target, links):
                raise Unsafe(
                    f"{member.name}: hard link to {member.linkname!r}, not a file before it"
                )
        if member.issym():
            links.add(name)
        elif member.isreg():
            files.add(name)


def _under_link(name: str, links: set[str]) -> bool:
    parent = posixpath.dirname(name)
    while parent:
        if parent in links:
            return True
        parent = posixpath.dirname(parent)
    return False


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or PurePosixPath(name).is_absolute():
        raise Unsafe(f"{name}: absolute path")
    if ".." in parts:
        raise Unsafe(f"{name}: '..' in the path")
    if member.type not in _ALLOWED:
        raise Unsafe(f"{name}: not a file, folder or link")
    if member.issym() and not _inside(posixpath.dirname(name), member.linkname):
        raise Unsafe(f"{name}: symlink to {member.linkname!r} leaves the destination")
    if member.islnk() and not _inside("", member.linkname):
        raise Unsafe(f"{name}: hard link to {member.linkname!r} leaves the destination")
