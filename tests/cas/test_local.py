"""The folder store: names, round trips, checks on write and read, atomic writes, modes, id."""

import asyncio
import contextlib
import os
import stat
from pathlib import Path

import pytest

from service.cas import base
from service.cas.local import LocalStore
from tests.cas.conftest import blob, chunked, collect, flip_byte, sha

EMPTY = sha(b"")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


class TestNames:
    def test_valid_name_is_returned(self):
        """A 64-character lowercase hex name passes unchanged."""
        name = sha(b"x")
        assert base.check_name(name) == name

    @pytest.mark.parametrize(
        "name", ["", "abc", sha(b"x").upper(), sha(b"x") + "0", "g" * 64, "../" + "a" * 61]
    )
    def test_bad_names_are_refused(self, name):
        """Anything else raises BadName, which is a ValueError and a CasError."""
        with pytest.raises(base.BadName) as info:
            base.check_name(name)
        assert isinstance(info.value, ValueError)
        assert isinstance(info.value, base.CasError)

    async def test_store_refuses_bad_names(self, local):
        """Every store method checks the name before touching the disk."""
        with pytest.raises(base.BadName):
            await local.stat("../../etc/passwd")
        with pytest.raises(base.BadName):
            await collect(local.get("nope"))


class TestLocalStore:
    async def test_round_trip(self, local):
        """A blob put in chunks comes back identical, named by its sha256, with its size."""
        data = blob(3_000_000)
        assert await local.put(chunked(data)) == (sha(data), len(data))
        assert await local.stat(sha(data)) == len(data)
        assert await collect(local.get(sha(data))) == data

    async def test_whole_read_comes_in_bounded_chunks(self, local):
        """A whole read yields chunks of at most about 1 MiB."""
        data = blob(3_500_000)
        name, _ = await local.put(chunked(data))
        sizes = [len(c) async for c in local.get(name)]
        assert max(sizes) <= base.CHUNK
        assert sum(sizes) == len(data)

    async def test_empty_blob(self, local):
        """The empty blob is a blob like any other."""
        assert await local.put(chunked(b"")) == (EMPTY, 0)
        assert await collect(local.get(EMPTY)) == b""
        assert await local.stat(EMPTY) == 0

    async def test_put_is_idempotent(self, local):
        """Putting the same content twice, named or not, keeps one blob and answers the same."""
        data = blob(10_000)
        first = await local.put(chunked(data))
        assert await local.put(chunked(data)) == first
        assert await local.put(chunked(data), sha256=sha(data)) == first
        assert [e async for e in local.list()] == [first]

    async def test_wrong_name_is_refused_and_nothing_kept(self, local):
        """A put whose content does not hash to the given name raises Corrupt and keeps nothing."""
        data, claimed = blob(50_000), sha(b"something else")
        with pytest.raises(base.Corrupt) as info:
            await local.put(chunked(data), sha256=claimed)
        assert claimed in str(info.value)
        assert sha(data) in str(info.value)
        assert await local.stat(claimed) is None
        assert await local.stat(sha(data)) is None
        assert [p.name for p in local.root.iterdir()] == []

    async def test_wrong_content_for_present_blob_is_refused(self, local):
        """Putting other content under the name of a stored blob is refused; the blob stays."""
        data = blob(1000)
        await local.put(chunked(data))
        with pytest.raises(base.Corrupt):
            await local.put(chunked(b"other"), sha256=sha(data))
        assert await collect(local.get(sha(data))) == data

    async def test_corrupted_blob_refused_on_whole_read(self, local):
        """A blob damaged on disk fails a whole read with Corrupt naming both hashes."""
        data = blob(2_500_000)
        name, _ = await local.put(chunked(data))
        flip_byte(local.path(name), 1234)
        seen = bytearray()
        with pytest.raises(base.Corrupt) as info:
            await collect(local.get(name), seen)
        assert name in str(info.value)
        assert sha(data[:1234] + bytes([data[1234] ^ 0xFF]) + data[1235:]) in str(info.value)
        assert len(seen) < len(data)  # the consumer never had the whole (wrong) blob

    async def test_range_read_of_corrupted_blob_is_served(self, local):
        """A range read cannot be verified and is served as it is, damage included."""
        data = blob(10_000)
        name, _ = await local.put(chunked(data))
        flip_byte(local.path(name), 5000)
        assert await collect(local.get(name, start=100, end=200)) == data[100:200]
        assert await collect(local.get(name, start=4999, end=5001)) == bytes(
            [data[4999], data[5000] ^ 0xFF]
        )

    async def test_range_reads(self, local):
        """start/end select bytes [start, end); past the end reads stop at the end."""
        data = blob(3_000_000)
        name, _ = await local.put(chunked(data))
        assert await collect(local.get(name, start=10, end=20)) == data[10:20]
        assert await collect(local.get(name, start=2_999_990)) == data[2_999_990:]
        assert (
            await collect(local.get(name, start=1_000_000, end=2_500_000))
            == data[1_000_000:2_500_000]
        )
        assert await collect(local.get(name, start=5, end=5)) == b""
        assert await collect(local.get(name, start=4_000_000)) == b""
        with pytest.raises(ValueError, match="range"):
            await collect(local.get(name, start=20, end=10))

    async def test_missing(self, local):
        """An absent blob: stat None, get raises Missing before yielding, delete False."""
        name = sha(b"absent")
        assert await local.stat(name) is None
        with pytest.raises(base.Missing):
            await anext(local.get(name))
        with pytest.raises(base.Missing):
            await collect(local.get(name, start=3, end=9))
        assert await local.delete(name) is False

    async def test_delete(self, local):
        """delete removes the blob and says it did."""
        name, _ = await local.put(chunked(b"bye"))
        assert await local.delete(name) is True
        assert await local.stat(name) is None

    async def test_list(self, local):
        """list yields every blob and its size, and nothing else in the folder."""
        blobs = [blob(n, seed=n) for n in (0, 1, 100, 70_000)]
        for data in blobs:
            await local.put(chunked(data))
        await local.id()  # the id file is not a blob
        (local.root / ".tmp-stray").write_bytes(b"left by a crash")
        assert sorted([e async for e in local.list()]) == sorted((sha(d), len(d)) for d in blobs)

    async def test_list_of_new_store_is_empty(self, tmp_path):
        """A store whose folder does not exist yet lists nothing."""
        assert [e async for e in LocalStore(tmp_path / "none").list()] == []

    async def test_layout(self, local):
        """Blobs live at root/ab/cd/<sha256>."""
        name, _ = await local.put(chunked(b"layout"))
        assert (local.root / name[:2] / name[2:4] / name).read_bytes() == b"layout"

    async def test_failed_put_leaves_no_temp_file(self, local):
        """A stream that fails half way leaves neither a blob nor a temporary file."""

        async def broken():
            yield blob(2_000_000)
            raise OSError("the network went away")

        with pytest.raises(OSError, match="network"):
            await local.put(broken())
        assert list(local.root.iterdir()) == []

    async def test_abandoned_put_leaves_no_temp_file(self, local):
        """A put cancelled while it waits for data removes its temporary file."""
        waiting, never = asyncio.Event(), asyncio.Event()

        async def stalls():
            yield blob(100_000)
            waiting.set()  # the put has taken the first chunk: its temporary file exists
            await never.wait()
            yield b"never"

        task = asyncio.create_task(local.put(stalls()))
        await waiting.wait()
        assert len(list(local.root.glob(".tmp-*"))) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert list(local.root.glob(".tmp-*")) == []

    async def test_modes(self, local):
        """The root and its folders are 0700, blob and id files 0600, whatever the umask."""
        old = os.umask(0o022)
        try:
            name, _ = await local.put(chunked(b"private"))
            await local.id()
        finally:
            os.umask(old)
        path = local.path(name)
        assert mode(local.root) == 0o700
        assert mode(path.parent) == 0o700
        assert mode(path.parent.parent) == 0o700
        assert mode(path) == 0o600
        assert mode(local.root / ".berth-store-id") == 0o600

    async def test_id_is_stable(self, tmp_path):
        """The id is created once and read back by every later instance on the same root."""
        first = await LocalStore(tmp_path / "s").id()
        assert len(first) == 32
        assert await LocalStore(tmp_path / "s").id() == first
        assert await LocalStore(tmp_path / "other").id() != first

    async def test_early_close_releases_the_file(self, local):
        """A reader that stops after one chunk can close the stream at once."""
        name, _ = await local.put(chunked(blob(3_000_000)))
        async with contextlib.aclosing(local.get(name)) as stream:
            async for _ in stream:
                break


class TestFiles:
    async def test_put_file_and_get_file(self, local, tmp_path):
        """put_file uploads a file by its hash; get_file writes it back atomically."""
        src = tmp_path / "in.bin"
        src.write_bytes(blob(1_500_000))
        name, size = await base.put_file(local, src)
        assert (name, size) == (sha(src.read_bytes()), 1_500_000)
        dest = tmp_path / "out" / "copy.bin"
        dest.parent.mkdir()
        assert await base.get_file(local, name, dest) == size
        assert dest.read_bytes() == src.read_bytes()
        assert [p.name for p in dest.parent.iterdir()] == ["copy.bin"]

    async def test_put_file_skips_a_stored_blob(self, local, tmp_path):
        """A file whose blob is already stored is not uploaded again."""
        src = tmp_path / "in.bin"
        src.write_bytes(b"same")
        name, _ = await base.put_file(local, src)
        before = local.path(name).stat().st_mtime_ns
        local.path(name).chmod(0o400)  # a rewrite would replace the file (new inode, mode 0600)
        assert await base.put_file(local, src) == (name, 4)
        assert local.path(name).stat().st_mtime_ns == before
        assert mode(local.path(name)) == 0o400

    async def test_get_file_of_corrupt_blob_leaves_destination_alone(self, local, tmp_path):
        """A corrupt blob is never written to the destination, which keeps its old content."""
        name, _ = await local.put(chunked(blob(2_000_000)))
        flip_byte(local.path(name))
        dest = tmp_path / "dest.bin"
        dest.write_bytes(b"old")
        with pytest.raises(base.Corrupt):
            await base.get_file(local, name, dest)
        assert dest.read_bytes() == b"old"
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".dest")] == []

    async def test_get_file_missing(self, local, tmp_path):
        """get_file of an absent blob raises Missing and creates nothing."""
        with pytest.raises(base.Missing):
            await base.get_file(local, sha(b"none"), tmp_path / "x")
        assert not (tmp_path / "x").exists()
