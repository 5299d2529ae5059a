"""The artifact store's pure pieces: `[cas]` checks, Range parsing, the cas serve key."""

import json
import os
from pathlib import Path

import pytest

from service.api.cas_wire import byte_range
from service.config import load
from service.core.errors import Invalid
from service.domain.artifacts import server_store


def cas(section: dict) -> object:
    env = {"BERTH_CONFIG_JSON": json.dumps({"cas": section})}
    return load(Path("/nonexistent/berth.toml"), environ=env).cas


class TestCasConfig:
    @pytest.mark.parametrize(
        "section",
        [
            {},
            {"root": "/srv/cas", "gc_days": 7, "gc_seconds": 5},
            {"provider": "http", "url": "https://cas:7701/cas"},
            {"provider": "cached", "url": "https://cas/cas", "local_max_gb": 2, "root": "/c"},
            {
                "provider": "s3",
                "bucket": "b",
                "prefix": "p",
                "endpoint_url": "http://s3",
                "region": "r",
            },
        ],
    )
    def test_accepted(self, section):
        """Each provider takes the keys it reads."""
        assert cas(section) is not None

    @pytest.mark.parametrize(
        ("section", "words"),
        [
            ({"url": "https://x"}, "cas.url has no effect with provider 'local'"),
            ({"provider": "s3", "bucket": "b", "root": "/x"}, "cas.root has no effect"),
            ({"provider": "http", "bucket": "b", "url": "u"}, "cas.bucket has no effect"),
            ({"provider": "http"}, "cas.url"),
            ({"provider": "cached", "url": "u"}, "cas.local_max_gb"),
            ({"provider": "s3"}, "cas.bucket"),
            ({"gc_days": 0}, "cas.gc_days"),
            ({"gc_seconds": -1}, "cas.gc_seconds"),
        ],
    )
    def test_refused_naming_the_key(self, section, words):
        """A key with no effect, or one the provider needs and lacks, is refused by name."""
        with pytest.raises(Invalid, match=words):
            cas(section)


class TestByteRange:
    @pytest.mark.parametrize(
        ("header", "expected"),
        [
            (None, None),
            ("bytes=0-9", (0, 10)),
            ("bytes=5-", (5, 100)),
            ("bytes=90-200", (90, 100)),
            ("bytes=-10", (90, 100)),
            ("bytes=-500", (0, 100)),
            ("bytes=100-", (100, 100)),  # at the end: 416
            ("bytes=-0", (100, 100)),
        ],
    )
    def test_ranges(self, header, expected):
        """A range is [start, end) of a 100-byte blob, clamped; past the end is (size, size)."""
        assert byte_range(header, 100) == expected

    @pytest.mark.parametrize("header", ["bytes=5-2", "bytes=-", "bytes=0-1,5-6", "items=0-1"])
    def test_bad_ranges(self, header):
        """A malformed range, or several, is a 400."""
        with pytest.raises(Invalid):
            byte_range(header, 100)


class TestServeKey:
    def test_derived_and_distinct(self):
        """The cas serve key is fixed for a secret key, differs between keys and is not it."""
        one, two = os.urandom(32), os.urandom(32)
        assert server_store.serve_key(one) == server_store.serve_key(one)
        assert server_store.serve_key(one) != server_store.serve_key(two)
        assert one.hex() != server_store.serve_key(one)
        assert len(server_store.serve_key(one)) == 64
