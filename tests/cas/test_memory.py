"""Memory stays bounded: a blob far larger than the allowance streams through put and get.

Each case runs tests/cas/memory_probe.py in a process of its own and reads its peak RSS growth.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

MIB = 1 << 20
LIMIT = 128 * MIB
ROOT = Path(__file__).resolve().parents[2]


def probe(kind: str, size_mib: int, folder: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "tests.cas.memory_probe", kind, str(size_mib), str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def check(result: dict, size_mib: int) -> None:
    assert result["size"] == result["read"] == size_mib * MIB
    assert result["sent"] == result["received"] == result["name"]
    assert result["growth"] < LIMIT, f"peak RSS grew by {result['growth'] / MIB:.0f} MiB"


class TestMemoryBound:
    def test_local_64_mib(self, tmp_path):
        """64 MiB through the folder store grows the process by far less than 128 MiB."""
        result = probe("local", 64, tmp_path)
        check(result, 64)
        assert result["growth"] < 32 * MIB

    def test_http_64_mib(self, tmp_path):
        """64 MiB through the HTTP client and a server in the same process stays bounded too."""
        result = probe("http", 64, tmp_path)
        check(result, 64)
        assert result["growth"] < 48 * MIB

    @pytest.mark.slow
    def test_local_2_gib(self, tmp_path):
        """2 GiB through the folder store's put and get grows the process by under 128 MiB."""
        check(probe("local", 2048, tmp_path), 2048)
