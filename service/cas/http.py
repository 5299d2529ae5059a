"""A client for a remote store over HTTP (`berth cas serve`, or the server's `/api/v1/cas`).

The endpoint contract, relative to the base URL (e.g. `https://host:7701/cas` or
`https://server/api/v1/cas`). Every request carries the caller's auth headers; an error answer
has a JSON body `{"error": "<one line>"}`.

    GET    {base}/.id        200 text/plain: the store's id (surrounding whitespace ignored).
    HEAD   {base}/{sha256}   200 with Content-Length = the blob's size; 404 when absent.
    GET    {base}/{sha256}   200, the whole blob, with Content-Length. The server checks the
                             digest as it streams and, on a mismatch, drops the connection before
                             the last bytes instead of completing the response.
           with `Range: bytes=A-B` (B inclusive) or `bytes=A-`: 206 with those bytes (B clamped to
                             size - 1) and `Content-Range: bytes A-B/SIZE`; 416 when A >= size.
    PUT    {base}/{sha256}   body: the blob (chunked transfer allowed). 201 (stored) or 200 (was
                             there; the server's tenant and worker routes answer 201 either way)
                             with JSON `{"sha256": ..., "size": ...}`, only once it is
                             durable; 422 when the body does not hash to the name (nothing kept).
                             The server reads the whole body before it answers.
    DELETE {base}/{sha256}   204 deleted; 404 absent.
    GET    {base}/.list      200 text/plain, one `<sha256> <size>` line per blob, streamed.
    Other statuses: 400 a bad name or range, 401/403 refused.

`.list` and DELETE serve the installation's garbage collector; the tenant-facing `/api/v1/cas`
may refuse them with 403. The client maps 404 to Missing, 422 to Corrupt and any other failure,
a dropped connection included, to CasError; it checks whole reads itself as well, so a
wrong server cannot hand over a complete wrong blob.
"""

import contextlib
import copy
import json
import ssl
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterable, Iterator, Mapping
from types import MappingProxyType
from typing import NoReturn

import httpx

from service.cas import base, files

NO_HEADERS: Mapping[str, str] = MappingProxyType({})


class HttpStore:
    """A remote store behind the contract above. `expected_id`, when given, must be its id."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] = NO_HEADERS,
        verify: str | None = None,
        expected_id: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        """A client for the store at `base_url`; no request is made until one is needed.

        Args:
            base_url: the store's base; a trailing slash is dropped.
            headers: sent with every request (the credential).
            verify: a CA bundle file for TLS; None trusts the system's CAs.
            expected_id: `id()` raises StoreMismatch when the remote's id differs.
            timeout: seconds for any one network step (connect, a read, a write).
        """
        self.base_url = base_url.rstrip("/")
        self._write_query = ""
        self._owns_client = True
        self._expected_id = expected_id
        self._id: str | None = None
        tls: ssl.SSLContext | bool = True
        if verify:
            tls = ssl.create_default_context(cafile=verify)
        self._client = httpx.AsyncClient(
            headers=dict(headers),
            verify=tls,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
        )

    async def fetch_id(self) -> str:
        """The remote store's id, read from `GET {base}/.id` every time."""
        url = f"{self.base_url}/.id"
        with _transport("GET", url):
            resp = await self._client.get(url)
        if resp.status_code != 200:
            await _fail(resp, "GET", url)
        store_id = resp.text.strip()
        if not store_id or len(store_id) > 200:
            raise base.CasError(f"GET {url}: not a store id: {resp.text[:80]!r}")
        return store_id

    async def id(self) -> str:
        if self._id is None:
            found = await self.fetch_id()
            if self._expected_id is not None and found != self._expected_id:
                raise base.StoreMismatch(
                    f"the store at {self.base_url} has id {found}, expected {self._expected_id}"
                )
            self._id = found
        return self._id

    async def stat(self, sha256: str) -> int | None:
        url = self._url(sha256)
        with _transport("HEAD", url):
            resp = await self._client.head(url)
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            await _fail(resp, "HEAD", url)
        try:
            return int(resp.headers["content-length"])
        except (KeyError, ValueError):
            raise base.CasError(f"HEAD {url}: no Content-Length in the answer") from None

    async def put(
        self, chunks: AsyncIterable[bytes], *, sha256: str | None = None
    ) -> tuple[str, int]:
        if sha256 is not None:
            return await self._upload(chunks, base.check_name(sha256))
        # The URL names the blob, so an unnamed stream is hashed into a spool file first.
        async with files.spool(chunks) as (path, name, _):
            return await self._upload(files.read_chunks(path), name)

    async def get(
        self, sha256: str, *, start: int = 0, end: int | None = None
    ) -> AsyncGenerator[bytes, None]:
        base.check_range(start, end)
        url = self._url(sha256)
        if end is not None and end <= start:
            if await self.stat(sha256) is None:
                raise base.Missing(f"no blob {sha256}")
            return
        whole = start == 0 and end is None
        headers = {} if whole else {"Range": f"bytes={start}-{'' if end is None else end - 1}"}
        stream = self._stream(url, headers, ranged=not whole)
        if whole:
            stream = base.verified(stream, sha256)
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                yield chunk

    async def delete(self, sha256: str) -> bool:
        url = self._url(sha256)
        with _transport("DELETE", url):
            resp = await self._client.delete(url)
        if resp.status_code == 404:
            return False
        if resp.status_code not in (200, 204):
            await _fail(resp, "DELETE", url)
        return True

    async def list(self) -> AsyncGenerator[tuple[str, int], None]:
        url = f"{self.base_url}/.list"
        with _transport("GET", url):
            async with self._client.stream("GET", url) as resp:
                if resp.status_code != 200:
                    await _fail(resp, "GET", url)
                async for line in resp.aiter_lines():
                    if not line.strip():
                        continue
                    try:
                        name, size = line.split()
                        yield base.check_name(name), int(size)
                    except ValueError:
                        raise base.CasError(f"GET {url}: bad line {line[:100]!r}") from None

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    def writing_with(self, params: Mapping[str, str | int]) -> "HttpStore":
        """A view of this store whose uploads carry `params` in their query; it shares the client.

        The server's worker route fences a write for a job this way (`?job=&epoch=&what=`).
        """
        view = copy.copy(self)
        view._write_query = "?" + urllib.parse.urlencode(dict(params))
        view._owns_client = False
        return view

    def _url(self, sha256: str) -> str:
        return f"{self.base_url}/{base.check_name(sha256)}"

    async def _upload(self, chunks: AsyncIterable[bytes], sha256: str) -> tuple[str, int]:
        url = self._url(sha256) + self._write_query
        with _transport("PUT", url):
            resp = await self._client.put(url, content=chunks)
        if resp.status_code not in (200, 201):
            await _fail(resp, "PUT", url)
        try:
            answer = resp.json()
            name, size = answer["sha256"], answer["size"]
        except (ValueError, KeyError, TypeError):
            raise base.CasError(f"PUT {url}: bad answer {resp.text[:100]!r}") from None
        if name != sha256 or not isinstance(size, int):
            raise base.CasError(f"PUT {url}: the server stored {name!r}, size {size!r}")
        return sha256, size

    async def _stream(
        self, url: str, headers: dict[str, str], *, ranged: bool
    ) -> AsyncGenerator[bytes, None]:
        with _transport("GET", url):
            async with self._client.stream("GET", url, headers=headers) as resp:
                if ranged and resp.status_code == 416:
                    return  # the range starts at or past the end: no bytes
                if resp.status_code != (206 if ranged else 200):
                    if resp.status_code == 200:
                        raise base.CasError(f"GET {url}: the server ignored the Range header")
                    await _fail(resp, "GET", url)
                async for chunk in resp.aiter_bytes():
                    yield chunk


@contextlib.contextmanager
def _transport(method: str, url: str) -> Iterator[None]:
    """Turn httpx's network errors (refused, reset, timed out, cut short) into CasError."""
    try:
        yield
    except httpx.HTTPError as exc:
        raise base.CasError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc


async def _fail(resp: httpx.Response, method: str, url: str) -> NoReturn:
    """Raise the error an unsuccessful answer stands for."""
    await resp.aread()
    message = _error_text(resp)
    if resp.status_code == 404:
        raise base.Missing(message or f"{method} {url}: not found")
    if resp.status_code == 422:
        raise base.Corrupt(message or f"{method} {url}: content does not match its name")
    raise base.CasError(f"{method} {url}: HTTP {resp.status_code}: {message}")


def _error_text(resp: httpx.Response) -> str:
    try:
        error = json.loads(resp.content)["error"]
    except (ValueError, KeyError, TypeError):
        return resp.text[:200].strip()
    return str(error)[:500]
