"""The contract every artifact store keeps, its errors, and the helpers built on it.

A blob is named by the sha256 of its content: 64 lowercase hex characters (`check_name`). Every
store checks content against its name on write (`put` refuses a mismatch and keeps nothing) and
on whole reads (`verified` holds the last chunk back until the digest is known, so a consumer never
sees a complete wrong blob). A range read cannot be checked and is served as it is. No store holds
a whole blob in memory: data moves in chunks of about `CHUNK` bytes.

`get` and `list` are async generators: an error such as `Missing` is raised by the first
`__anext__`, before anything is yielded. A consumer that stops early should close the generator
(`contextlib.aclosing`) so the file or connection behind it is released at once.
"""

import asyncio
import contextlib
import hashlib
import re
from collections.abc import AsyncGenerator, AsyncIterable
from pathlib import Path
from typing import IO, Protocol

from service.cas import files

CHUNK = files.CHUNK
_NAME = re.compile(r"[0-9a-f]{64}")
_HASH_IN_THREAD = 1 << 20  # below this, a thread hop costs more than hashing in the loop (~0.6 ms)


class CasError(Exception):
    """Base of every artifact store error."""


class Missing(CasError):
    """No blob of that name in the store."""


class Corrupt(CasError):
    """Content that does not hash to its name."""

    @classmethod
    def mismatch(cls, expected: str, actual: str) -> "Corrupt":
        return cls(f"blob {expected} is corrupt: its content hashes to {actual}")


class BadName(CasError, ValueError):
    """A name that is not 64 lowercase hex characters."""


class StoreMismatch(CasError):
    """The store answering is not the one expected (its id differs)."""


def check_name(name: str) -> str:
    """`name` itself when it is a sha256 in lowercase hex; raises BadName otherwise."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise BadName(f"not a sha256 name (64 lowercase hex characters): {name!r:.80}")
    return name


def check_range(start: int, end: int | None) -> None:
    """Raise ValueError for a negative start or an end before the start (end is exclusive)."""
    if start < 0 or (end is not None and end < start):
        raise ValueError(f"bad byte range: start={start} end={end}")


class Store(Protocol):
    """A content-addressed blob store. Implementations: local, http, cached, s3."""

    async def id(self) -> str:
        """The store's id, written at its root when it was created (created on first use)."""
        ...

    async def stat(self, sha256: str) -> int | None:
        """The blob's size in bytes; None when the store does not have it."""
        ...

    async def put(
        self, chunks: AsyncIterable[bytes], *, sha256: str | None = None
    ) -> tuple[str, int]:
        """Store the stream: (sha256, size). Corrupt, nothing kept, when it is not `sha256`.

        Putting a blob that exists is harmless (the stream is still read and checked).
        """
        ...

    def get(
        self, sha256: str, *, start: int = 0, end: int | None = None
    ) -> AsyncGenerator[bytes, None]:
        """Stream the blob (whole and verified) or bytes [start, end) of it (unverified).

        Missing before anything is yielded; Corrupt instead of the last chunk of a bad blob.
        """
        ...

    async def delete(self, sha256: str) -> bool:
        """Remove the blob; False when it was not there."""
        ...

    def list(self) -> AsyncGenerator[tuple[str, int], None]:
        """Every blob and its size, in no particular order (for garbage collection)."""
        ...

    async def aclose(self) -> None:
        """Release connections; the store is not used afterwards."""
        ...


async def hash_update(digest: "hashlib._Hash", data: bytes) -> None:
    """Feed `data` to `digest`, off the event loop when it is large (hashlib drops the GIL)."""
    if len(data) >= _HASH_IN_THREAD:
        await asyncio.to_thread(digest.update, data)
    else:
        digest.update(data)


async def verified(chunks: AsyncGenerator[bytes, None], sha256: str) -> AsyncGenerator[bytes, None]:
    """Pass `chunks` through, checking that the whole stream hashes to `sha256`.

    The last chunk is held back until the digest is known and Corrupt is raised instead of it
    when the digest differs.
    """
    digest = hashlib.sha256()
    held: bytes | None = None
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            if not chunk:
                continue
            await hash_update(digest, chunk)
            if held is not None:
                yield held
            held = chunk
    actual = digest.hexdigest()
    if actual != sha256:
        raise Corrupt.mismatch(sha256, actual)
    if held is not None:
        yield held


async def drain(chunks: AsyncIterable[bytes], sha256: str | None) -> tuple[str, int]:
    """Hash a stream without keeping it: (sha256, size); Corrupt when it is not `sha256`.

    Used when the blob is already stored: the caller's stream is still read to its end (an HTTP
    server must read a request body before answering) and checked.
    """
    digest = hashlib.sha256()
    size = 0
    async for chunk in chunks:
        await hash_update(digest, chunk)
        size += len(chunk)
    actual = digest.hexdigest()
    if sha256 is not None and actual != sha256:
        raise Corrupt.mismatch(sha256, actual)
    return actual, size


async def one_chunk(data: bytes) -> AsyncGenerator[bytes, None]:
    """`data` as a stream of one chunk, for `put` of bytes already in memory."""
    yield data


async def put_file(store: Store, path: Path) -> tuple[str, int]:
    """Upload a file, skipped when the store already has it: (sha256, size).

    The file is hashed first so that a blob already stored costs one `stat`, not an upload.
    A file that changes while it is uploaded fails with Corrupt and leaves nothing behind.
    """
    with path.open("rb") as f:
        return await put_open(store, f)


async def put_open(store: Store, f: IO[bytes]) -> tuple[str, int]:
    """`put_file` for a file already open, at its start.

    For a file that must not be reopened by name, such as one of a job's outputs (O_NOFOLLOW).
    """
    sha256, size = await asyncio.to_thread(files.hash_open, f)
    if await store.stat(sha256) == size:
        return sha256, size
    await asyncio.to_thread(f.seek, 0)
    return await store.put(files.read_open(f), sha256=sha256)


async def get_file(store: Store, sha256: str, path: Path) -> int:
    """Download a blob to `path` (replaced atomically, verified); returns its size.

    The data goes to a temporary file beside `path` and is renamed over it only once its digest
    matches, so `path` never holds a partial or wrong blob.
    """
    check_name(sha256)
    async with files.TempFile(path.parent, prefix=f".{path.name}.") as tmp:
        async with contextlib.aclosing(store.get(sha256)) as chunks:
            async for chunk in chunks:
                await tmp.write(chunk)
        actual, size = await tmp.finish()
        if actual != sha256:
            raise Corrupt.mismatch(sha256, actual)
        await tmp.commit(path)
    return size
