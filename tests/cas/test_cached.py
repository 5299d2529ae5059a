"""The cached store: a local LRU copy in front of a real HTTP remote."""

import pytest

from service.cas import base
from service.cas.cached import CachedStore
from service.cas.http import HttpStore
from service.cas.local import LocalStore
from tests.cas.conftest import blob, chunked, collect, flip_byte, remote_server, sha
from tests.cas.server import TOKEN


def gets(remote, name: str) -> int:
    """How many GETs of the blob the remote server answered."""
    return remote.app.requests.count(("GET", f"/cas/{name}"))


@pytest.fixture
def cache(tmp_path, remote):
    return CachedStore(LocalStore(tmp_path / "cache"), remote.client, max_bytes=10_000_000)


class TestCachedStore:
    async def test_miss_fills_then_hits(self, cache, remote):
        """A whole read it lacks comes from the remote and fills the copy; the next is local."""
        data = blob(2_500_000)
        name, _ = await remote.backing.put(chunked(data))
        assert await cache.local.stat(name) is None
        assert await collect(cache.get(name)) == data
        assert await cache.local.stat(name) == len(data)
        assert await collect(cache.get(name)) == data
        assert gets(remote, name) == 1

    async def test_fill_is_committed_before_the_last_chunk(self, cache, remote):
        """A reader that stops once it has every byte still leaves a filled copy."""
        data = blob(2_500_000)
        name, _ = await remote.backing.put(chunked(data))
        got = bytearray()
        stream = cache.get(name)
        while len(got) < len(data):
            got += await anext(stream)
        assert await cache.local.stat(name) == len(data)
        await stream.aclose()
        assert bytes(got) == data

    async def test_abandoned_fill_leaves_nothing(self, cache, remote):
        """A reader that stops half way leaves no copy and no temporary file."""
        name, _ = await remote.backing.put(chunked(blob(3_500_000)))
        stream = cache.get(name)
        await anext(stream)
        await stream.aclose()
        assert await cache.local.stat(name) is None
        assert list(cache.local.root.glob(".tmp-*")) == []

    async def test_put_goes_to_both(self, cache, remote):
        """A named put reaches the remote and the local copy."""
        data = blob(1_500_000)
        assert await cache.put(chunked(data), sha256=sha(data)) == (sha(data), len(data))
        assert await remote.backing.stat(sha(data)) == len(data)
        assert await cache.local.stat(sha(data)) == len(data)

    async def test_put_without_name_goes_to_both(self, cache, remote):
        """An unnamed put is named by the local write and sent to the remote by that name."""
        data = blob(1_500_000, seed=4)
        assert await cache.put(chunked(data)) == (sha(data), len(data))
        assert await collect(remote.backing.get(sha(data))) == data
        assert await cache.local.stat(sha(data)) == len(data)

    async def test_wrong_name_kept_nowhere(self, cache, remote):
        """A put refused by the remote leaves no local copy either."""
        claimed = sha(b"claimed")
        with pytest.raises(base.Corrupt):
            await cache.put(chunked(blob(100_000)), sha256=claimed)
        assert [e async for e in cache.local.list()] == []
        assert [e async for e in remote.backing.list()] == []
        assert list(cache.local.root.glob(".tmp-*")) == []

    async def test_eviction_is_least_recently_used(self, tmp_path, remote):
        """Over the limit, the least recently read or written blobs go first."""
        cache = CachedStore(LocalStore(tmp_path / "c"), remote.client, max_bytes=int(1e-6 * 1e9))
        a, b, c, d, e = (blob(300, seed=i) for i in range(5))
        for data in (a, b, c):
            await cache.put(chunked(data))
        assert await collect(cache.get(sha(a))) == a  # a is now the most recent
        await cache.put(chunked(d))  # 1200 bytes > 1000: b, the oldest, goes
        assert await cache.local.stat(sha(b)) is None
        assert {n async for n, _ in cache.local.list()} == {sha(a), sha(c), sha(d)}
        await cache.put(chunked(e))
        assert {n async for n, _ in cache.local.list()} == {sha(a), sha(d), sha(e)}
        assert await collect(cache.get(sha(b))) == b  # evicted locally, still on the remote
        assert {n async for n, _ in cache.local.list()} == {sha(d), sha(e), sha(b)}

    async def test_blob_larger_than_the_cache_is_not_kept(self, tmp_path, remote):
        """A blob larger than the whole copy is served but not kept."""
        cache = CachedStore(LocalStore(tmp_path / "c"), remote.client, max_bytes=1000)
        data = blob(5000)
        name, _ = await remote.backing.put(chunked(data))
        assert await collect(cache.get(name)) == data
        assert [e async for e in cache.local.list()] == []

    async def test_reads_survive_the_remote(self, tmp_path):
        """Once the remote is gone, cached blobs are still served; others fail with CasError."""
        async with remote_server(tmp_path / "r") as r:
            client = HttpStore(r.url, headers={"Authorization": f"Bearer {TOKEN}"})
            cache = CachedStore(LocalStore(tmp_path / "c"), client, max_bytes=10_000_000)
            kept, other = blob(1_000_000), blob(1000, seed=2)
            await r.backing.put(chunked(other))
            await cache.put(chunked(kept))
        try:
            assert await collect(cache.get(sha(kept))) == kept
            assert await collect(cache.get(sha(kept), start=10, end=20)) == kept[10:20]
            assert await cache.stat(sha(kept)) == len(kept)
            with pytest.raises(base.CasError):
                await collect(cache.get(sha(other)))
        finally:
            await cache.aclose()

    async def test_range_miss_passes_through(self, cache, remote):
        """A range read it lacks is served by the remote without filling the copy."""
        data = blob(100_000)
        name, _ = await remote.backing.put(chunked(data))
        assert await collect(cache.get(name, start=5, end=50)) == data[5:50]
        assert await cache.local.stat(name) is None

    async def test_corrupt_local_copy_is_dropped(self, cache, remote):
        """A damaged local copy fails the read with Corrupt and is dropped; the next read
        fetches a good one."""
        data = blob(2_000_000)
        await cache.put(chunked(data))
        flip_byte(cache.local.path(sha(data)), 7)
        with pytest.raises(base.Corrupt):
            await collect(cache.get(sha(data)))
        assert await cache.local.stat(sha(data)) is None
        assert await collect(cache.get(sha(data))) == data

    async def test_missing(self, cache):
        """A blob neither side has is Missing, and stat says None."""
        assert await cache.stat(sha(b"none")) is None
        with pytest.raises(base.Missing):
            await anext(cache.get(sha(b"none")))

    async def test_id_list_delete_answer_for_the_remote(self, cache, remote):
        """id and list are the remote's; delete drops both copies."""
        assert await cache.id() == await remote.backing.id()
        name, _ = await cache.put(chunked(b"shared"))
        await remote.backing.put(chunked(b"remote only"))
        assert sorted([e async for e in cache.list()]) == sorted(
            [e async for e in remote.backing.list()]
        )
        assert await cache.delete(name) is True
        assert await cache.local.stat(name) is None
        assert await remote.backing.stat(name) is None
