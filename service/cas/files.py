"""Blocking file work for the stores, done in worker threads so the event loop never waits on disk.

`TempFile` is how a blob reaches its name: written under a temporary name in the destination's
folder, hashed as it is written, fsynced, then renamed into place. The rename is atomic, so a
crash leaves at most a stray temporary file, never a partial blob under a real name. Files are
created 0600 (mkstemp). Memory per stream stays near `CHUNK`: writes are buffered up to one chunk,
reads come one chunk at a time.
"""

import asyncio
import contextlib
import hashlib
import os
import tempfile
from collections.abc import AsyncGenerator, AsyncIterable, Iterable
from pathlib import Path
from types import TracebackType
from typing import IO, Self

CHUNK = 1 << 20


def hash_file(path: Path) -> tuple[str, int]:
    """(sha256, size) of a file, read in chunks. Blocking: call it in a thread."""
    with path.open("rb") as f:
        return hash_open(f)


def hash_open(f: IO[bytes]) -> tuple[str, int]:
    """(sha256, size) of an open file from where it stands to its end. Blocking."""
    return hash_chunks(iter(lambda: f.read(CHUNK), b""))


def hash_chunks(chunks: Iterable[bytes]) -> tuple[str, int]:
    """(sha256, size) of a stream of bytes. Blocking when the stream is."""
    digest = hashlib.sha256()
    size = 0
    for block in chunks:
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


async def read_open(f: IO[bytes]) -> AsyncGenerator[bytes, None]:
    """An open file from where it stands to its end, in chunks read in a thread."""
    while block := await asyncio.to_thread(f.read, CHUNK):
        yield block


async def read_chunks(
    path: Path, *, start: int = 0, end: int | None = None
) -> AsyncGenerator[bytes, None]:
    """Bytes [start, end) of a file in chunks; FileNotFoundError before anything is yielded."""
    f = await asyncio.to_thread(path.open, "rb")
    try:
        if start:
            await asyncio.to_thread(f.seek, start)
        left = None if end is None else end - start
        while left is None or left > 0:
            want = CHUNK if left is None else min(CHUNK, left)
            block = await asyncio.to_thread(f.read, want)
            if not block:
                return
            if left is not None:
                left -= len(block)
            yield block
    finally:
        f.close()


def fsync_dir(folder: Path) -> None:
    """Flush a directory so that a rename in it survives a crash. Blocking."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TempFile:
    """A file written under a temporary name in `folder`, then renamed into place or removed.

    Use it as an async context manager: leaving the block without `commit` removes the file.
    """

    def __init__(self, folder: Path, *, prefix: str = ".tmp-") -> None:
        self.folder = folder
        self._prefix = prefix
        self._file: IO[bytes] | None = None
        self._path: Path | None = None
        self._digest = hashlib.sha256()
        self._size = 0
        self._pending: list[bytes] = []
        self._pending_size = 0
        self._done = False

    @property
    def path(self) -> Path:
        assert self._path is not None, "TempFile used outside its async with block"
        return self._path

    async def __aenter__(self) -> Self:
        fd, name = await asyncio.to_thread(tempfile.mkstemp, dir=self.folder, prefix=self._prefix)
        self._path = Path(name)
        self._file = os.fdopen(fd, "wb")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._done:
            return
        # Also on cancellation: the temporary file must not outlive a failed or abandoned write.
        if self._file is not None:
            self._file.close()
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._path.unlink()

    async def write(self, data: bytes) -> None:
        """Append `data`; it reaches the disk (and the digest) in chunks of about CHUNK bytes."""
        if not data:
            return
        self._pending.append(data)
        self._pending_size += len(data)
        if self._pending_size >= CHUNK:
            await self._flush()

    async def finish(self) -> tuple[str, int]:
        """Flush, fsync and close the file: (sha256, size) of everything written."""
        await self._flush()
        f = self._file
        assert f is not None
        await asyncio.to_thread(_sync_close, f)
        self._file = None
        return self._digest.hexdigest(), self._size

    async def commit(self, dest: Path) -> None:
        """Rename the finished file to `dest` (replacing it) and make the rename durable."""
        assert self._file is None, "finish() before commit()"
        await asyncio.to_thread(_rename, self.path, dest)
        self._done = True

    async def _flush(self) -> None:
        if not self._pending:
            return
        parts, self._pending, self._pending_size = self._pending, [], 0
        f = self._file
        assert f is not None
        await asyncio.to_thread(_write_all, f, self._digest, parts)
        self._size += sum(len(p) for p in parts)


def _write_all(f: IO[bytes], digest: "hashlib._Hash", parts: list[bytes]) -> None:
    for part in parts:
        digest.update(part)
        f.write(part)


def _sync_close(f: IO[bytes]) -> None:
    f.flush()
    os.fsync(f.fileno())
    f.close()


def _rename(src: Path, dest: Path) -> None:
    src.replace(dest)
    fsync_dir(dest.parent)


@contextlib.asynccontextmanager
async def spool(
    chunks: AsyncIterable[bytes], folder: Path | None = None
) -> AsyncGenerator[tuple[Path, str, int], None]:
    """Write a stream to a temporary file, yielding (path, sha256, size); removed afterwards.

    For stores that need a blob's name before they can send it (http, s3): memory stays bounded,
    the disk holds one copy for the length of the upload.
    """
    folder = Path(tempfile.gettempdir()) if folder is None else folder
    async with TempFile(folder, prefix=".berth-spool-") as tmp:
        async for chunk in chunks:
            await tmp.write(chunk)
        sha256, size = await tmp.finish()
        yield tmp.path, sha256, size
