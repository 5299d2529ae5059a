"""A remote store with a local copy of what was read or written lately, at most `max_bytes`.

Reads come from the local copy when it has the blob; a whole read it lacks is fetched from the
remote and streamed to the caller while it is written to the local copy, which gets the blob only
once the whole stream has been checked. Range reads it lacks pass through to the remote without
filling. Writes go to the remote and to the local copy. The remote is the truth: `id`, `list` and
`delete` answer for it (delete also drops the local copy).

Recency is the file's mtime, set on each write and read from a clock that never repeats a value,
so the order holds even when reads come faster than the file system's timestamp tick. After
each fill or write, the oldest blobs are evicted until the copy is within `max_bytes`; a blob
larger than the whole copy is evicted at once. Eviction scans the folder: fine for the thousands
of blobs a worker's cache holds, not meant for millions.
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterable

from service.cas import base
from service.cas.local import LocalStore


class CachedStore:
    """`remote` behind a least-recently-used local copy in `local`."""

    def __init__(self, local: LocalStore, remote: base.Store, *, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("a cache needs a positive size")
        self.local = local
        self.remote = remote
        self.max_bytes = max_bytes
        self._last_ns = 0
        self._evicting = asyncio.Lock()

    async def id(self) -> str:
        return await self.remote.id()

    async def stat(self, sha256: str) -> int | None:
        size = await self.local.stat(sha256)
        return size if size is not None else await self.remote.stat(sha256)

    async def put(
        self, chunks: AsyncIterable[bytes], *, sha256: str | None = None
    ) -> tuple[str, int]:
        if sha256 is None:
            # The local write names the blob; the remote then gets it by that name.
            name, size = await self.local.put(chunks)
            await self._touch(name)
            async with contextlib.aclosing(self.local.get(name)) as copy:
                await self.remote.put(copy, sha256=name)
            await self._evict()
            return name, size
        base.check_name(sha256)
        async with await self.local.begin() as tmp:

            async def tee() -> AsyncGenerator[bytes, None]:
                async for chunk in chunks:
                    await tmp.write(chunk)
                    yield chunk

            result = await self.remote.put(tee(), sha256=sha256)
            await self.local.commit(tmp, sha256)
        await self._touch(sha256)
        await self._evict()
        return result

    async def get(
        self, sha256: str, *, start: int = 0, end: int | None = None
    ) -> AsyncGenerator[bytes, None]:
        base.check_range(start, end)
        whole = start == 0 and end is None
        if await self.local.touch(sha256, self._tick()):
            stream = self.local.get(sha256, start=start, end=end)
            yielded = False
            try:
                async with contextlib.aclosing(stream):
                    async for chunk in stream:
                        yielded = True
                        yield chunk
            except base.Missing:
                if yielded:
                    raise
                # Evicted between the touch and the open: read it from the remote below.
            except base.Corrupt:
                await self.local.delete(sha256)  # the next read fetches a good copy
                raise
            else:
                return
        stream = self.remote.get(sha256, start=start, end=end)
        if not whole:
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    yield chunk
            return
        async with contextlib.aclosing(self._fill(sha256, stream)) as filled:
            async for chunk in filled:
                yield chunk

    async def delete(self, sha256: str) -> bool:
        await self.local.delete(sha256)
        return await self.remote.delete(sha256)

    async def list(self) -> AsyncGenerator[tuple[str, int], None]:
        stream = self.remote.list()
        async with contextlib.aclosing(stream):
            async for entry in stream:
                yield entry

    async def aclose(self) -> None:
        await self.remote.aclose()

    async def _fill(
        self, sha256: str, stream: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[bytes, None]:
        """Pass a verified remote stream through, keeping a local copy of it.

        One chunk is held back so that the copy is committed before the caller has everything:
        a caller that stops once it has the expected size still leaves a filled cache.
        """
        async with await self.local.begin() as tmp, contextlib.aclosing(stream):
            held: bytes | None = None
            async for chunk in stream:
                await tmp.write(chunk)
                if held is not None:
                    yield held
                held = chunk
            await self.local.commit(tmp, sha256)
        await self._touch(sha256)
        await self._evict()
        if held is not None:
            yield held

    def _tick(self) -> int:
        """Now in ns, later than any value given before (the recency order has no ties)."""
        self._last_ns = max(time.time_ns(), self._last_ns + 1)
        return self._last_ns

    async def _touch(self, sha256: str) -> None:
        await self.local.touch(sha256, self._tick())

    async def _evict(self) -> None:
        async with self._evicting:
            usage = await self.local.usage()
            total = sum(size for _, size, _ in usage)
            for _, size, name in usage:  # oldest first
                if total <= self.max_bytes:
                    break
                await self.local.delete(name)
                total -= size
