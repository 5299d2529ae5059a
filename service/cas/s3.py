"""A store in an S3 bucket (or an S3-compatible service): `<prefix>/<sha256>` objects.

The client is obstore, chosen over aiobotocore because it is natively async (Rust, no thread
pool), ships its own type hints, and streams multipart uploads and ranged downloads itself
with a small dependency footprint; the cost is that credentials come from the environment
(`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, web identity, container or
instance metadata) but not from `~/.aws` profiles.

The prefix is a folder: `prefix = "berth"` keeps blobs at `berth/<sha256>` and the store id at
`berth/.berth-store-id` (an empty prefix: the bucket's top). A put of a known name streams to
that key while hashing: a blob of at most one part goes up in one PUT after it is checked, a
larger one as a multipart upload of `part_size` parts with at most `concurrency` in flight (so
memory holds a few parts), and a digest mismatch found at the end aborts the upload before it
completes, so nothing is kept. A put without a name is spooled to a local temporary file
first, since the key must be known before the upload starts. A whole read is a series of range
requests of at most `_WINDOW` bytes (each request within the client's timeout however large the
blob), verified as it streams.
"""

import contextlib
import hashlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

import obstore
import obstore.exceptions
import obstore.store

from service.cas import base, files

if TYPE_CHECKING:
    from obstore.store import ClientConfig, S3Config

ID_KEY = ".berth-store-id"
PART = 16 << 20
_WINDOW = 64 << 20  # bytes per ranged GET of a whole read


class S3Store:
    """Blobs as objects in `bucket` under `prefix`."""

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str = "",
        region: str = "",
        part_size: int = PART,
        concurrency: int = 2,
    ) -> None:
        if part_size < 5 << 20:
            raise ValueError("S3 multipart parts are at least 5 MiB")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._part = part_size
        self._concurrency = concurrency
        self._id: str | None = None
        config: S3Config = {}
        if endpoint_url:
            config["endpoint"] = endpoint_url
        if region:
            config["region"] = region
        client: ClientConfig = {
            "connect_timeout": timedelta(seconds=10),
            "timeout": timedelta(minutes=10),  # one request: a part or a window, never a blob
            "allow_http": endpoint_url.startswith("http://"),
        }
        self._store = obstore.store.S3Store(bucket, config=config, client_options=client)

    def key(self, name: str) -> str:
        """The object key of a blob (or of the id object)."""
        return f"{self.prefix}/{name}" if self.prefix else name

    async def id(self) -> str:
        if self._id is None:
            self._id = await self._read_or_create_id()
        return self._id

    async def stat(self, sha256: str) -> int | None:
        key = self.key(base.check_name(sha256))
        try:
            with _errors("HEAD", key):
                meta = await obstore.head_async(self._store, key)
        except FileNotFoundError:
            return None
        return meta["size"]

    async def put(
        self, chunks: AsyncIterable[bytes], *, sha256: str | None = None
    ) -> tuple[str, int]:
        if sha256 is None:
            async with files.spool(chunks) as (path, name, _):
                return await self._upload(files.read_chunks(path), name)
        return await self._upload(chunks, base.check_name(sha256))

    async def get(
        self, sha256: str, *, start: int = 0, end: int | None = None
    ) -> AsyncGenerator[bytes, None]:
        base.check_range(start, end)
        size = await self.stat(sha256)
        if size is None:
            raise base.Missing(f"no blob {sha256}")
        stop = size if end is None else min(end, size)
        stream = self._windows(self.key(sha256), start, stop)
        if start == 0 and end is None:
            stream = base.verified(stream, sha256)
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                yield chunk

    async def delete(self, sha256: str) -> bool:
        # S3 deletes are silent about absent keys, so ask first to answer False.
        if await self.stat(sha256) is None:
            return False
        with _errors("DELETE", self.key(sha256)):
            await obstore.delete_async(self._store, self.key(sha256))
        return True

    async def list(self) -> AsyncGenerator[tuple[str, int], None]:
        skip = len(self.prefix) + 1 if self.prefix else 0
        with _errors("LIST", self.prefix or "/"):
            async for batch in obstore.list(self._store, self.prefix or None, chunk_size=1000):
                for meta in batch:
                    name = meta["path"][skip:]
                    if len(name) == 64 and all(c in "0123456789abcdef" for c in name):
                        yield name, meta["size"]

    async def aclose(self) -> None:
        return None

    async def _upload(self, chunks: AsyncIterable[bytes], sha256: str) -> tuple[str, int]:
        if await self.stat(sha256) is not None:
            return await base.drain(chunks, sha256)
        key = self.key(sha256)
        digest = hashlib.sha256()
        size = 0
        head: list[bytes] = []
        it = aiter(chunks)
        async for chunk in it:
            await base.hash_update(digest, chunk)
            size += len(chunk)
            head.append(chunk)
            if size > self._part:
                break
        else:
            # All of it fits in one part: check it, then one PUT.
            actual = digest.hexdigest()
            if actual != sha256:
                raise base.Corrupt.mismatch(sha256, actual)
            with _errors("PUT", key):
                await obstore.put_async(self._store, key, b"".join(head), use_multipart=False)
            return sha256, size

        total = size

        async def rest() -> AsyncGenerator[bytes, None]:
            nonlocal total
            for chunk in head:
                yield chunk
            head.clear()
            async for chunk in it:
                await base.hash_update(digest, chunk)
                total += len(chunk)
                yield chunk
            actual = digest.hexdigest()
            if actual != sha256:
                # Raised inside the upload's own stream: obstore aborts the multipart upload,
                # so the key never appears.
                raise base.Corrupt.mismatch(sha256, actual)

        with _errors("PUT", key):
            await obstore.put_async(
                self._store,
                key,
                rest(),
                use_multipart=True,
                chunk_size=self._part,
                max_concurrency=self._concurrency,
            )
        return sha256, total

    async def _windows(self, key: str, start: int, stop: int) -> AsyncGenerator[bytes, None]:
        at = start
        while at < stop:
            upto = min(at + _WINDOW, stop)
            try:
                with _errors("GET", key):
                    result = await obstore.get_async(
                        self._store, key, options={"range": (at, upto)}
                    )
                    async for buf in result.stream(min_chunk_size=files.CHUNK):
                        at += len(buf)
                        yield buf
            except FileNotFoundError:
                raise base.Missing(f"blob at {key} vanished while it was read") from None

    async def _read_or_create_id(self) -> str:
        key = self.key(ID_KEY)
        with contextlib.suppress(FileNotFoundError):
            return await self._read_text(key)
        new = uuid.uuid4().hex.encode()
        with _errors("PUT", key):
            try:
                # "create" is a conditional PUT (If-None-Match: *): the first writer's id wins.
                await obstore.put_async(self._store, key, new, mode="create")
            except obstore.exceptions.AlreadyExistsError:
                pass
            except obstore.exceptions.NotSupportedError:
                # A service without conditional writes: two first users racing may each see
                # their own id once; whichever landed last is the store's id from then on.
                await obstore.put_async(self._store, key, new)
        return await self._read_text(key)

    async def _read_text(self, key: str) -> str:
        with _errors("GET", key):
            result = await obstore.get_async(self._store, key)
            return bytes(await result.bytes_async()).decode().strip()


@contextlib.contextmanager
def _errors(method: str, key: str) -> Iterator[None]:
    """Turn obstore's errors into CasError.

    A 404 (FileNotFoundError) on GET or HEAD passes through, its caller knows what is missing;
    on a write or a listing it can only mean that the bucket does not exist.
    """
    try:
        yield
    except FileNotFoundError as exc:
        if method in ("GET", "HEAD"):
            raise
        raise base.CasError(f"s3 {method} {key}: no such bucket") from exc
    except obstore.exceptions.BaseError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise base.CasError(f"s3 {method} {key}: {type(exc).__name__}: {first}") from exc
