"""The HTTP store client against a real server on 127.0.0.1 (tests/cas/server.py)."""

import pytest

from service.cas import base
from service.cas.http import HttpStore
from tests.cas.conftest import blob, chunked, collect, flip_byte, remote_server, sha


class TestHttpStore:
    async def test_round_trip(self, remote):
        """A streamed put lands in the server's store; a get streams it back."""
        data = blob(2_700_000)
        assert await remote.client.put(chunked(data), sha256=sha(data)) == (sha(data), len(data))
        assert await remote.backing.stat(sha(data)) == len(data)
        assert await collect(remote.client.get(sha(data))) == data

    async def test_put_without_name(self, remote):
        """A put without a name is hashed on the client, then sent under that name."""
        data = blob(1_200_000, seed=3)
        assert await remote.client.put(chunked(data)) == (sha(data), len(data))
        assert ("PUT", f"/cas/{sha(data)}") in remote.app.requests
        assert await collect(remote.backing.get(sha(data))) == data

    async def test_put_twice(self, remote):
        """Putting a blob the server has is harmless."""
        data = blob(5000)
        first = await remote.client.put(chunked(data), sha256=sha(data))
        assert await remote.client.put(chunked(data), sha256=sha(data)) == first

    async def test_wrong_name_is_refused(self, remote):
        """The server's 422 becomes Corrupt with its message; nothing is kept."""
        claimed = sha(b"claimed")
        with pytest.raises(base.Corrupt, match=claimed):
            await remote.client.put(chunked(blob(300_000)), sha256=claimed)
        assert [e async for e in remote.backing.list()] == []

    async def test_stat(self, remote):
        """HEAD gives the size of a present blob and None for an absent one."""
        name, _ = await remote.backing.put(chunked(b"12345"))
        assert await remote.client.stat(name) == 5
        assert await remote.client.stat(sha(b"absent")) is None

    async def test_missing(self, remote):
        """An absent blob raises Missing before anything is yielded, for whole and range reads."""
        name = sha(b"absent")
        with pytest.raises(base.Missing):
            await anext(remote.client.get(name))
        with pytest.raises(base.Missing):
            await anext(remote.client.get(name, start=2, end=5))
        with pytest.raises(base.Missing):
            await anext(remote.client.get(name, start=5, end=5))

    async def test_range_reads(self, remote):
        """Range reads send `Range: bytes=a-b` and get exactly bytes [start, end)."""
        data = blob(3_000_000, seed=9)
        name, _ = await remote.backing.put(chunked(data))
        client = remote.client
        assert await collect(client.get(name, start=0, end=1)) == data[:1]
        assert await collect(client.get(name, start=100, end=2_100_000)) == data[100:2_100_000]
        assert await collect(client.get(name, start=2_999_000)) == data[2_999_000:]
        assert await collect(client.get(name, start=2_999_000, end=9_000_000)) == data[2_999_000:]
        assert await collect(client.get(name, start=3_000_000)) == b""
        assert await collect(client.get(name, start=7, end=7)) == b""

    async def test_server_side_check_cuts_the_stream(self, remote):
        """A server that finds its copy corrupt drops the connection: the client gets a
        CasError and never the whole blob."""
        data = blob(3_000_000)
        name, _ = await remote.backing.put(chunked(data))
        flip_byte(remote.backing.path(name), 10)
        seen = bytearray()
        with pytest.raises(base.CasError):
            await collect(remote.client.get(name), seen)
        assert len(seen) < len(data)

    async def test_client_side_check(self, tmp_path):
        """A server that serves a wrong blob whole is caught by the client: Corrupt, both hashes."""
        async with remote_server(tmp_path / "r", verify=False) as r:
            data = blob(2_500_000)
            name, _ = await r.backing.put(chunked(data))
            flip_byte(r.backing.path(name), 2_400_000)
            seen = bytearray()
            with pytest.raises(base.Corrupt) as info:
                await collect(r.client.get(name), seen)
            assert name in str(info.value)
            assert sha(r.backing.path(name).read_bytes()) in str(info.value)
            assert len(seen) < len(data)

    async def test_delete(self, remote):
        """DELETE removes the blob (True), then finds nothing (False)."""
        name, _ = await remote.backing.put(chunked(b"x"))
        assert await remote.client.delete(name) is True
        assert await remote.client.delete(name) is False
        assert await remote.backing.stat(name) is None

    async def test_list(self, remote):
        """.list streams every blob and its size."""
        blobs = [blob(n, seed=n) for n in (0, 10, 5000)]
        for data in blobs:
            await remote.backing.put(chunked(data))
        got = sorted([e async for e in remote.client.list()])
        assert got == sorted((sha(d), len(d)) for d in blobs)

    async def test_id(self, remote):
        """The id is read from GET .id and matches the server's store."""
        assert await remote.client.fetch_id() == await remote.backing.id()
        assert await remote.client.id() == await remote.backing.id()

    async def test_expected_id(self, remote):
        """A client expecting another store's id refuses this one with StoreMismatch."""
        right = HttpStore(
            remote.url,
            headers=dict(remote.client._client.headers),
            expected_id=await remote.backing.id(),
        )
        wrong = HttpStore(
            remote.url, headers=dict(remote.client._client.headers), expected_id="0" * 32
        )
        try:
            assert await right.id() == await remote.backing.id()
            with pytest.raises(base.StoreMismatch, match="0" * 32):
                await wrong.id()
        finally:
            await right.aclose()
            await wrong.aclose()

    async def test_refused_without_credential(self, remote):
        """A request without the auth header is refused with a CasError naming the status."""
        anonymous = HttpStore(remote.url)
        try:
            with pytest.raises(base.CasError, match="401"):
                await anonymous.stat(sha(b"x"))
            with pytest.raises(base.CasError, match="401"):
                await anonymous.put(chunked(b"x"), sha256=sha(b"x"))
        finally:
            await anonymous.aclose()

    async def test_unreachable_server(self, tmp_path):
        """A server that is gone gives a CasError, not an httpx error."""
        async with remote_server(tmp_path / "r") as r:
            url = r.url
        gone = HttpStore(url, headers={"Authorization": "Bearer x"}, timeout=5)
        try:
            with pytest.raises(base.CasError, match="ConnectError"):
                await gone.stat(sha(b"x"))
        finally:
            await gone.aclose()

    async def test_base_url_trailing_slash(self, remote):
        """A base URL given with a trailing slash works the same."""
        store = HttpStore(remote.url + "/", headers=dict(remote.client._client.headers))
        try:
            assert await store.fetch_id() == await remote.backing.id()
        finally:
            await store.aclose()
