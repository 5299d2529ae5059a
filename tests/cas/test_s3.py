"""The S3 store against a moto S3 server on 127.0.0.1."""

import boto3
import pytest

from service.cas import base
from service.cas.s3 import S3Store
from tests.cas.conftest import blob, chunked, collect, sha

MIB = 1 << 20


@pytest.fixture
def s3(s3_endpoint, bucket):
    return S3Store(bucket, prefix="berth/", endpoint_url=s3_endpoint, region="us-east-1")


@pytest.fixture
def raw(s3_endpoint):
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    yield client
    client.close()


def keys(raw, bucket) -> list[str]:
    return sorted(o["Key"] for o in raw.list_objects_v2(Bucket=bucket).get("Contents", []))


class TestS3Store:
    async def test_round_trip(self, s3, bucket, raw):
        """A small blob goes up in one PUT under <prefix>/<sha256> and comes back."""
        data = blob(700_000)
        assert await s3.put(chunked(data), sha256=sha(data)) == (sha(data), len(data))
        assert keys(raw, bucket) == [f"berth/{sha(data)}"]
        assert await collect(s3.get(sha(data))) == data
        assert await s3.stat(sha(data)) == len(data)

    async def test_multipart(self, s3, bucket, raw):
        """A 40 MiB blob goes up as a multipart upload of 16 MiB parts and reads back whole."""
        data = blob(40 * MIB, seed=5)
        assert await s3.put(chunked(data, MIB), sha256=sha(data)) == (sha(data), len(data))
        head = raw.head_object(Bucket=bucket, Key=f"berth/{sha(data)}")
        assert head["ETag"].strip('"').endswith("-3")  # three parts
        assert await collect(s3.get(sha(data))) == data

    async def test_multipart_with_wrong_name_keeps_nothing(self, s3, bucket, raw):
        """A large upload that does not hash to its name is aborted: no object, no open upload."""
        claimed = sha(b"claimed")
        with pytest.raises(base.Corrupt, match=claimed):
            await s3.put(chunked(blob(20 * MIB), MIB), sha256=claimed)
        assert keys(raw, bucket) == []
        assert raw.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []

    async def test_small_with_wrong_name_keeps_nothing(self, s3, bucket, raw):
        """A small upload that does not hash to its name is refused before it is sent."""
        with pytest.raises(base.Corrupt):
            await s3.put(chunked(b"small"), sha256=sha(b"other"))
        assert keys(raw, bucket) == []

    async def test_put_without_name(self, s3):
        """An unnamed put is spooled, hashed, then stored under its sha256."""
        data = blob(18 * MIB, seed=6)
        assert await s3.put(chunked(data, MIB)) == (sha(data), len(data))
        assert await s3.stat(sha(data)) == len(data)

    async def test_put_twice(self, s3):
        """Putting a stored blob again is harmless and still checks the stream."""
        data = blob(1000)
        first = await s3.put(chunked(data), sha256=sha(data))
        assert await s3.put(chunked(data), sha256=sha(data)) == first
        with pytest.raises(base.Corrupt):
            await s3.put(chunked(b"not it"), sha256=sha(data))

    async def test_range_reads(self, s3):
        """Range reads return bytes [start, end), clamped at the end, empty past it."""
        data = blob(3 * MIB, seed=8)
        name, _ = await s3.put(chunked(data), sha256=sha(data))
        assert await collect(s3.get(name, start=10, end=20)) == data[10:20]
        assert await collect(s3.get(name, start=MIB, end=2 * MIB + 5)) == data[MIB : 2 * MIB + 5]
        assert await collect(s3.get(name, start=3 * MIB - 3)) == data[-3:]
        assert await collect(s3.get(name, start=3 * MIB - 3, end=10 * MIB)) == data[-3:]
        assert await collect(s3.get(name, start=3 * MIB)) == b""
        assert await collect(s3.get(name, start=4, end=4)) == b""

    async def test_corrupt_object_refused_on_whole_read(self, s3, bucket, raw):
        """An object whose content was changed under its name fails a whole read with Corrupt."""
        data = blob(2 * MIB)
        name, _ = await s3.put(chunked(data), sha256=sha(data))
        bad = bytes([data[0] ^ 1]) + data[1:]
        raw.put_object(Bucket=bucket, Key=f"berth/{name}", Body=bad)
        seen = bytearray()
        with pytest.raises(base.Corrupt) as info:
            await collect(s3.get(name), seen)
        assert name in str(info.value)
        assert sha(bad) in str(info.value)
        assert len(seen) < len(data)
        assert await collect(s3.get(name, start=0, end=4)) == bad[:4]

    async def test_missing(self, s3):
        """An absent blob: stat None, get Missing before yielding, delete False."""
        name = sha(b"absent")
        assert await s3.stat(name) is None
        with pytest.raises(base.Missing):
            await anext(s3.get(name))
        with pytest.raises(base.Missing):
            await anext(s3.get(name, start=1, end=3))
        assert await s3.delete(name) is False

    async def test_delete_and_list(self, s3, bucket, raw):
        """list yields the blobs under the prefix only; delete removes one."""
        blobs = [blob(n, seed=n) for n in (0, 1, 1000)]
        for data in blobs:
            await s3.put(chunked(data), sha256=sha(data))
        await s3.id()
        raw.put_object(Bucket=bucket, Key="elsewhere/" + sha(b"x"), Body=b"x")
        raw.put_object(Bucket=bucket, Key="berth/notes.txt", Body=b"not a blob")
        assert sorted([e async for e in s3.list()]) == sorted((sha(d), len(d)) for d in blobs)
        assert await s3.delete(sha(blobs[1])) is True
        assert await s3.stat(sha(blobs[1])) is None
        assert len([e async for e in s3.list()]) == 2

    async def test_id(self, s3, s3_endpoint, bucket, raw):
        """The id is created once as <prefix>/.berth-store-id and read by every later client."""
        first = await s3.id()
        assert (
            raw.get_object(Bucket=bucket, Key="berth/.berth-store-id")["Body"].read().decode()
            == first
        )
        again = S3Store(bucket, prefix="berth", endpoint_url=s3_endpoint)
        assert await again.id() == first
        other = S3Store(bucket, prefix="other", endpoint_url=s3_endpoint)
        assert await other.id() != first

    async def test_no_prefix(self, s3_endpoint, bucket, raw):
        """With no prefix, blobs and the id sit at the top of the bucket."""
        store = S3Store(bucket, endpoint_url=s3_endpoint)
        name, _ = await store.put(chunked(b"top"))
        await store.id()
        assert keys(raw, bucket) == [".berth-store-id", name]
        assert [e async for e in store.list()] == [(name, 3)]

    async def test_missing_bucket(self, s3_endpoint):
        """A bucket that does not exist fails id() and put with a CasError saying so."""
        store = S3Store("berth-no-such-bucket", endpoint_url=s3_endpoint)
        with pytest.raises(base.CasError, match="no such bucket"):
            await store.id()
        with pytest.raises(base.CasError, match="no such bucket"):
            await store.put(chunked(b"x"))

    def test_small_parts_are_refused(self, bucket):
        """S3 parts below 5 MiB are refused when the store is made."""
        with pytest.raises(ValueError, match="5 MiB"):
            S3Store(bucket, part_size=MIB)
