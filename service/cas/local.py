"""A store in a folder: `root/ab/cd/<sha256>`, plus `root/.berth-store-id`.

A blob is written to a temporary file in the root (`.tmp-*`), fsynced, checked against its name,
then renamed into place, so a blob under its name is always complete and right when written (a
crash leaves only a stray `.tmp-*` file, which `list` ignores). The root and its folders are
created 0700 and files 0600: a job running under another uid cannot read the store. Every disk
operation runs in a worker thread.
"""

import asyncio
import contextlib
import os
import tempfile
import uuid
from collections.abc import AsyncGenerator, AsyncIterable
from pathlib import Path

from service.cas import base, files

ID_FILE = ".berth-store-id"
Usage = list[tuple[int, int, str]]  # (mtime_ns, size, sha256)


class LocalStore:
    """A folder of blobs. Several processes may share one root: every write is a rename."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._id: str | None = None

    def path(self, sha256: str) -> Path:
        """Where the blob named `sha256` lives (whether or not it is there)."""
        base.check_name(sha256)
        return self.root / sha256[:2] / sha256[2:4] / sha256

    async def id(self) -> str:
        if self._id is None:
            self._id = await asyncio.to_thread(self._read_or_create_id)
        return self._id

    async def stat(self, sha256: str) -> int | None:
        path = self.path(sha256)
        try:
            st = await asyncio.to_thread(path.stat)
        except FileNotFoundError:
            return None
        return st.st_size

    async def put(
        self, chunks: AsyncIterable[bytes], *, sha256: str | None = None
    ) -> tuple[str, int]:
        expected = None if sha256 is None else base.check_name(sha256)
        if expected is not None and await self.stat(expected) is not None:
            return await base.drain(chunks, expected)
        async with await self.begin() as tmp:
            async for chunk in chunks:
                await tmp.write(chunk)
            return await self.commit(tmp, expected)

    async def begin(self) -> files.TempFile:
        """A temporary file in the root for a blob being written; `commit` names it."""
        await asyncio.to_thread(_make_dir, self.root)
        return files.TempFile(self.root)

    async def commit(self, tmp: files.TempFile, sha256: str | None) -> tuple[str, int]:
        """Finish `tmp` and rename it to the name its content hashes to: (sha256, size).

        Corrupt when that is not `sha256`; the caller's `async with` then removes the file.
        """
        actual, size = await tmp.finish()
        if sha256 is not None and actual != sha256:
            raise base.Corrupt.mismatch(sha256, actual)
        dest = self.path(actual)
        await asyncio.to_thread(_make_dirs, self.root, dest.parent)
        await tmp.commit(dest)
        return actual, size

    async def get(
        self, sha256: str, *, start: int = 0, end: int | None = None
    ) -> AsyncGenerator[bytes, None]:
        base.check_range(start, end)
        path = self.path(sha256)
        whole = start == 0 and end is None
        try:
            chunks = files.read_chunks(path, start=start, end=end)
            first = await anext(chunks, None)
        except FileNotFoundError:
            raise base.Missing(f"no blob {sha256}") from None
        stream = _prepend(first, chunks)
        if whole:
            stream = base.verified(stream, sha256)
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                yield chunk

    async def delete(self, sha256: str) -> bool:
        path = self.path(sha256)
        try:
            await asyncio.to_thread(path.unlink)
        except FileNotFoundError:
            return False
        return True

    async def list(self) -> AsyncGenerator[tuple[str, int], None]:
        # One thread call per top-level folder: 1/256 of the store in memory at a time.
        top = await asyncio.to_thread(_subdirs, self.root)
        for folder in top:
            for name, st in await asyncio.to_thread(_blobs_under, folder):
                yield name, st.st_size

    async def touch(self, sha256: str, mtime_ns: int) -> bool:
        """Set the blob's mtime (the cache's recency); False when it is gone."""
        try:
            await asyncio.to_thread(os.utime, self.path(sha256), ns=(mtime_ns, mtime_ns))
        except FileNotFoundError:
            return False
        return True

    async def usage(self) -> Usage:
        """(mtime_ns, size, sha256) of every blob, oldest first."""
        return await asyncio.to_thread(self._usage)

    async def aclose(self) -> None:
        return None

    def _usage(self) -> Usage:
        out = [
            (st.st_mtime_ns, st.st_size, name)
            for folder in _subdirs(self.root)
            for name, st in _blobs_under(folder)
        ]
        out.sort()
        return out

    def _read_or_create_id(self) -> str:
        path = self.root / ID_FILE
        with contextlib.suppress(FileNotFoundError):
            return path.read_text().strip()
        _make_dir(self.root)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(uuid.uuid4().hex + "\n")
                f.flush()
                os.fsync(f.fileno())
            # link, unlike rename, fails when the name exists: the first writer's id wins and
            # is kept forever, even when two processes open a new store at once.
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
                files.fsync_dir(self.root)
        finally:
            Path(tmp).unlink()
        return path.read_text().strip()


async def _prepend(
    first: bytes | None, rest: AsyncGenerator[bytes, None]
) -> AsyncGenerator[bytes, None]:
    async with contextlib.aclosing(rest):
        if first is None:
            return
        yield first
        async for chunk in rest:
            yield chunk


def _make_dir(folder: Path) -> None:
    """Create `folder` (and missing parents) 0700; an existing folder is left as it is."""
    try:
        folder.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        return
    folder.chmod(0o700)  # mkdir's mode is masked by the umask; the store must not be readable


def _make_dirs(root: Path, folder: Path) -> None:
    _make_dir(root)
    _make_dir(folder.parent)
    _make_dir(folder)


def _scan(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _subdirs(folder: Path) -> list[Path]:
    """The fan-out folders (two hex characters) of `folder`, sorted."""
    return sorted(
        Path(e.path)
        for e in _scan(folder)
        if len(e.name) == 2 and e.is_dir(follow_symlinks=False) and _is_hex(e.name)
    )


def _blobs_under(folder: Path) -> list[tuple[str, os.stat_result]]:
    """Every blob under a top-level fan-out folder, with its stat."""
    out = []
    for second in _subdirs(folder):
        for entry in _scan(second):
            if len(entry.name) == 64 and _is_hex(entry.name):
                with contextlib.suppress(FileNotFoundError):  # deleted since the scan
                    out.append((entry.name, entry.stat(follow_symlinks=False)))
    return out


def _is_hex(name: str) -> bool:
    return all(c in "0123456789abcdef" for c in name)
