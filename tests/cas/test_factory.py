"""open_store: each provider from a `[cas]` config, and configs that cannot work refused."""

import pytest

from service.cas import base
from service.cas.cached import CachedStore
from service.cas.factory import open_store
from service.cas.http import HttpStore
from service.cas.local import LocalStore
from service.cas.s3 import S3Store
from service.config import Cas
from tests.cas.conftest import chunked, collect
from tests.cas.server import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


class TestOpenStore:
    async def test_local_defaults_under_home(self, tmp_path):
        """provider local with no root keeps blobs in $BERTH_HOME/cas."""
        store = open_store(Cas(), home=tmp_path)
        assert isinstance(store, LocalStore)
        assert store.root == tmp_path / "cas"
        name, _ = await store.put(chunked(b"hello"))
        assert (tmp_path / "cas" / name[:2] / name[2:4] / name).exists()

    def test_local_root(self, tmp_path):
        """An explicit root is used as it is."""
        store = open_store(Cas(root=str(tmp_path / "elsewhere")), home=tmp_path)
        assert isinstance(store, LocalStore)
        assert store.root == tmp_path / "elsewhere"

    async def test_http(self, tmp_path, remote):
        """provider http talks to cfg.url with the given headers."""
        store = open_store(Cas(provider="http", url=remote.url), home=tmp_path, headers=AUTH)
        try:
            assert isinstance(store, HttpStore)
            assert await store.id() == await remote.backing.id()
        finally:
            await store.aclose()

    async def test_http_expected_id(self, tmp_path, remote):
        """An expected id is passed on to the client, which refuses another store."""
        store = open_store(
            Cas(provider="http", url=remote.url), home=tmp_path, headers=AUTH, expected_id="x"
        )
        try:
            with pytest.raises(base.StoreMismatch, match="expected x"):
                await store.id()
        finally:
            await store.aclose()

    async def test_cached(self, tmp_path, remote):
        """provider cached puts a local copy of local_max_gb in $BERTH_HOME/cas-cache before
        the remote."""
        cfg = Cas(provider="cached", url=remote.url, local_max_gb=0.5)
        store = open_store(cfg, home=tmp_path, headers=AUTH)
        try:
            assert isinstance(store, CachedStore)
            assert store.local.root == tmp_path / "cas-cache"
            assert store.max_bytes == 500_000_000
            name, _ = await store.put(chunked(b"cached"))
            assert await collect(remote.backing.get(name)) == b"cached"
            assert await store.local.stat(name) == 6
            assert await store.id() == await remote.backing.id()
        finally:
            await store.aclose()

    def test_cached_root(self, tmp_path):
        """A cached store's root is its local copy's folder."""
        cfg = Cas(provider="cached", url="http://127.0.0.1:1/cas", local_max_gb=1, root="/x/c")
        store = open_store(cfg, home=tmp_path)
        assert isinstance(store, CachedStore)
        assert str(store.local.root) == "/x/c"

    async def test_s3(self, tmp_path, s3_endpoint, bucket):
        """provider s3 uses bucket, prefix, endpoint_url and region."""
        cfg = Cas(
            provider="s3", bucket=bucket, prefix="p", endpoint_url=s3_endpoint, region="us-east-1"
        )
        store = open_store(cfg, home=tmp_path)
        assert isinstance(store, S3Store)
        assert (store.bucket, store.prefix) == (bucket, "p")
        name, _ = await store.put(chunked(b"in s3"))
        assert await collect(store.get(name)) == b"in s3"

    @pytest.mark.parametrize(
        ("cfg", "key"),
        [
            (Cas(provider="http"), "url"),
            (Cas(provider="cached", local_max_gb=1), "url"),
            (Cas(provider="cached", url="https://cas"), "local_max_gb"),
            (Cas(provider="cached", url="https://cas", local_max_gb=-1), "local_max_gb"),
            (Cas(provider="s3"), "bucket"),
        ],
    )
    def test_unworkable_configs_are_refused(self, tmp_path, cfg, key):
        """A config that cannot work raises ValueError with one line naming the key."""
        with pytest.raises(ValueError, match=rf"\[cas\] {key}") as info:
            open_store(cfg, home=tmp_path)
        assert "\n" not in str(info.value)
