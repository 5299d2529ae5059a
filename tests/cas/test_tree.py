"""A folder as a deterministic tar, and extraction that refuses to write outside its folder."""

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from service.cas import tree
from service.cas.local import LocalStore
from tests.cas.conftest import blob, collect


def make_tree(root: Path, order: list[str], mtime: int) -> None:
    """The same content each time, created in `order`, every mtime set to `mtime`."""
    files = {
        "b.txt": b"bee\n",
        "a/run.sh": b"#!/bin/sh\necho hi\n",
        "a/deep/big.bin": blob(2_500_000),
        "a/deep/empty": b"",
        "z" * 150: b"a long name\n",  # needs a PAX header
        "ünïcode.txt": "ü\n".encode(),
    }
    for name in order:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])
        path.chmod(0o700 if name.endswith(".sh") else 0o600)
    (root / "a" / "link").symlink_to("deep/big.bin")
    (root / "empty-dir").mkdir()
    for path in [root, *root.rglob("*")]:
        os.utime(path, (mtime, mtime), follow_symlinks=False)


def tar_bytes(root: Path) -> bytes:
    return b"".join(tree.iter_tar(root))


def tar_of(members: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in members:
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, b""


def regular(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


class TestPack:
    def test_same_tree_same_bytes(self, tmp_path):
        """Two trees with the same content, made in another order at other times, give
        identical tars."""
        names = ["b.txt", "a/run.sh", "a/deep/big.bin", "a/deep/empty", "z" * 150, "ünïcode.txt"]
        make_tree(tmp_path / "one", names, mtime=1_000_000)
        make_tree(tmp_path / "two", list(reversed(names)), mtime=2_000_000_000)
        first = tar_bytes(tmp_path / "one")
        assert first == tar_bytes(tmp_path / "two")
        assert first == tar_bytes(tmp_path / "one")
        assert len(first) % tarfile.RECORDSIZE == 0

    def test_headers_are_normalised(self, tmp_path):
        """Entries are sorted per folder, mtime 0, owner 0 without names, modes 0o755/0o644."""
        make_tree(tmp_path / "t", ["b.txt", "a/run.sh", "a/deep/big.bin", "a/deep/empty"], mtime=5)
        with tarfile.open(fileobj=io.BytesIO(tar_bytes(tmp_path / "t"))) as tf:
            members = tf.getmembers()
        assert [m.name for m in members] == [
            "a",
            "a/deep",
            "a/deep/big.bin",
            "a/deep/empty",
            "a/link",
            "a/run.sh",
            "b.txt",
            "empty-dir",
        ]
        for m in members:
            assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
        modes = {m.name: m.mode for m in members if not m.issym()}
        assert modes["a/run.sh"] == 0o755
        assert modes["b.txt"] == 0o644
        assert modes["a"] == 0o755
        assert next(m for m in members if m.name == "a/link").linkname == "deep/big.bin"

    async def test_pack_streams_chunks(self, tmp_path):
        """The async form yields the same bytes in chunks of about 1 MiB, never the whole."""
        make_tree(tmp_path / "t", ["a/deep/big.bin", "b.txt"], mtime=5)
        chunks = [c async for c in tree.pack(tmp_path / "t")]
        assert b"".join(chunks) == tar_bytes(tmp_path / "t")
        assert len(chunks) > 2
        assert max(len(c) for c in chunks) <= 2 * (1 << 20)

    def test_escaping_symlinks_are_refused(self, tmp_path):
        """A symlink that leaves the tree (absolute, `..`, or through another link) is refused."""
        for target in ["/etc/passwd", "../outside", "sub/../../x"]:
            root = tmp_path / f"t{abs(hash(target))}"
            (root / "sub").mkdir(parents=True)
            (root / "l").symlink_to(target)
            with pytest.raises(tree.Unsafe, match="leaves the tree"):
                tar_bytes(root)
        root = tmp_path / "chain"
        (root / "sub").mkdir(parents=True)
        (root / "sub" / "up").symlink_to("..")
        (root / "evil").symlink_to("sub/up/..")  # lexically "sub", really the tree's parent
        with pytest.raises(tree.Unsafe, match="evil"):
            tar_bytes(root)

    def test_symlink_loop_is_refused(self, tmp_path):
        """A loop of links is refused with a message naming the link, not a crash."""
        (tmp_path / "a").symlink_to("b")
        (tmp_path / "b").symlink_to("a")
        with pytest.raises(tree.Unsafe, match="cannot be resolved"):
            tar_bytes(tmp_path)

    def test_symlinked_folder_is_not_followed(self, tmp_path):
        """A link to a folder inside the tree is stored as a link, not walked twice."""
        root = tmp_path / "t"
        (root / "real").mkdir(parents=True)
        (root / "real" / "f").write_bytes(b"once")
        (root / "alias").symlink_to("real")
        with tarfile.open(fileobj=io.BytesIO(tar_bytes(root))) as tf:
            assert tf.getnames() == ["alias", "real", "real/f"]

    def test_fifo_is_refused(self, tmp_path):
        """Anything but files, folders and links is refused."""
        os.mkfifo(tmp_path / "pipe")
        with pytest.raises(tree.Unsafe, match="pipe"):
            tar_bytes(tmp_path)


class TestExtract:
    async def test_round_trip_through_a_store(self, tmp_path):
        """A packed tree stored, fetched and extracted is the same tree."""
        src = tmp_path / "src"
        make_tree(src, ["b.txt", "a/run.sh", "a/deep/big.bin", "a/deep/empty", "z" * 150], 7)
        store = LocalStore(tmp_path / "cas")
        name, _ = await store.put(tree.pack(src))
        tar = tmp_path / "in.tar"
        tar.write_bytes(await collect(store.get(name)))
        dest = tmp_path / "dest" / "src"
        await tree.unpack(tar, dest)
        for path in src.rglob("*"):
            other = dest / path.relative_to(src)
            if path.is_symlink():
                assert other.readlink() == path.readlink()
            elif path.is_file():
                assert other.read_bytes() == path.read_bytes()
            else:
                assert other.is_dir()
        assert os.access(dest / "a" / "run.sh", os.X_OK)
        assert tar_bytes(dest) == tar_bytes(src)

    @pytest.mark.parametrize(
        ("member", "reason"),
        [
            (regular("../x"), "'..'"),
            (regular("a/../../x"), "'..'"),
            (regular("/etc/x"), "absolute"),
            (link("l", "/etc/passwd"), "leaves"),
            (link("l", "../outside"), "leaves"),
            (link("a/l", "../../outside"), "leaves"),
            (link("h", "/etc/passwd", tarfile.LNKTYPE), "leaves"),
            (link("h", "../x", tarfile.LNKTYPE), "leaves"),
        ],
    )
    def test_unsafe_members_are_refused(self, tmp_path, member, reason):
        """A tar with a path or link leaving the destination is refused before anything is
        written."""
        tar = tmp_path / "bad.tar"
        tar.write_bytes(tar_of([regular("first.txt"), member]))
        dest = tmp_path / "dest"
        with pytest.raises(tree.Unsafe, match=reason):
            tree.extract(tar, dest)
        assert not dest.exists()
        assert not (tmp_path / "x").exists()
        assert not (tmp_path / "outside").exists()

    def test_device_is_refused(self, tmp_path):
        """Device files are refused."""
        info = tarfile.TarInfo("dev")
        info.type = tarfile.CHRTYPE
        tar = tmp_path / "dev.tar"
        tar.write_bytes(tar_of([(info, b"")]))
        with pytest.raises(tree.Unsafe, match="not a file"):
            tree.extract(tar, tmp_path / "dest")

    def test_links_inside_are_extracted(self, tmp_path):
        """Links that stay inside the destination are extracted as links, and a hard link to an
        earlier file of the archive as that file."""
        tar = tmp_path / "inside.tar"
        tar.write_bytes(
            tar_of(
                [
                    regular("data.txt", b"ok"),
                    link("sub", "."),
                    link("sub2", "sub"),
                    link("same", "data.txt", tarfile.LNKTYPE),
                ]
            )
        )
        dest = tmp_path / "dest"
        tree.extract(tar, dest)
        assert (dest / "sub2").readlink() == Path("sub")
        assert (dest / "sub2" / "data.txt").read_bytes() == b"ok"
        assert (dest / "same").stat().st_ino == (dest / "data.txt").stat().st_ino
        assert stat.S_IMODE(dest.stat().st_mode) == 0o700

    @pytest.mark.parametrize(
        ("members", "reason"),
        [
            ([link("sub", "."), regular("sub/x")], "under a symlink"),
            ([link("a", "b"), link("b", "."), regular("a/deep/x")], "under a symlink"),
            ([link("f", "data"), regular("f")], "twice"),
            ([regular("f"), regular("./f")], "twice"),
            ([link("sub", "."), link("h", "sub/f", tarfile.LNKTYPE)], "hard link"),
            ([link("h", "nothing", tarfile.LNKTYPE)], "hard link"),
            ([link("s", "f"), link("h", "s", tarfile.LNKTYPE)], "hard link"),
        ],
    )
    def test_nothing_is_written_through_a_link(self, tmp_path, members, reason):
        """The rules that need no path resolving (which long or chained links have fooled):
        no member under a symlink member, no name twice, a hard link only to an earlier file."""
        tar = tmp_path / "bad.tar"
        tar.write_bytes(tar_of(members))
        dest = tmp_path / "dest"
        with pytest.raises(tree.Unsafe, match=reason):
            tree.extract(tar, dest)
        assert not dest.exists()
        assert [p.name for p in tmp_path.iterdir()] == ["bad.tar"]

    def test_escape_through_a_chain_of_links_is_refused(self, tmp_path):
        """A link that escapes only through another link passes the name check but is stopped
        by the data filter; the destination is left absent."""
        tar = tmp_path / "chain.tar"
        sub = tarfile.TarInfo("sub")
        sub.type = tarfile.DIRTYPE
        tar.write_bytes(tar_of([(sub, b""), link("sub/up", ".."), link("evil", "sub/up/..")]))
        dest = tmp_path / "dest"
        with pytest.raises(tree.Unsafe, match="outside"):
            tree.extract(tar, dest)
        assert not dest.exists()
        assert [p.name for p in tmp_path.iterdir()] == ["chain.tar"]

    def test_non_empty_destination_is_refused(self, tmp_path):
        """Extraction does not merge into a folder that already has content."""
        tar = tmp_path / "t.tar"
        tar.write_bytes(tar_of([regular("f")]))
        (tmp_path / "dest").mkdir()
        (tmp_path / "dest" / "mine").write_bytes(b"keep")
        with pytest.raises(OSError, match="not empty"):
            tree.extract(tar, tmp_path / "dest")
        assert [p.name for p in (tmp_path / "dest").iterdir()] == ["mine"]
