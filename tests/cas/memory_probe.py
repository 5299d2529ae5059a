"""Stream a generated blob through a store's put and get and report the peak memory growth.

Run as `python -m tests.cas.memory_probe STORE SIZE_MIB DIR` (STORE: local or http) in a process
of its own, so that the peak RSS it reports belongs to this stream alone. Prints one JSON line.
"""

import asyncio
import contextlib
import hashlib
import json
import random
import resource
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from service.cas.base import Store
from service.cas.http import HttpStore
from service.cas.local import LocalStore
from tests.cas.server import TOKEN, CasApp, serving

MIB = 1 << 20


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


async def generated(size_mib: int, digest: "hashlib._Hash") -> AsyncIterator[bytes]:
    """`size_mib` MiB of pseudo-random data: 8 random blocks cycled, each chunk numbered."""
    rng = random.Random(7)
    blocks = [rng.randbytes(MIB - 8) for _ in range(8)]
    for i in range(size_mib):
        chunk = i.to_bytes(8, "little") + blocks[i % len(blocks)]
        digest.update(chunk)
        yield chunk


async def run(store: Store, size_mib: int) -> dict[str, object]:
    name, _ = await store.put(generated(4, hashlib.sha256()))  # warm up: threads, connections
    async for _ in store.get(name):
        pass
    baseline = peak_rss()
    digest_in = hashlib.sha256()
    name, size = await store.put(generated(size_mib, digest_in))
    digest_out = hashlib.sha256()
    read = 0
    async for chunk in store.get(name):
        digest_out.update(chunk)
        read += len(chunk)
    return {
        "growth": peak_rss() - baseline,
        "size": size,
        "read": read,
        "name": name,
        "sent": digest_in.hexdigest(),
        "received": digest_out.hexdigest(),
    }


async def main(kind: str, size_mib: int, folder: Path) -> None:
    if kind == "local":
        result = await run(LocalStore(folder / "cas"), size_mib)
    else:
        async with serving(CasApp(LocalStore(folder / "remote"))) as url:
            store = HttpStore(url, headers={"Authorization": f"Bearer {TOKEN}"})
            async with contextlib.aclosing(store):
                result = await run(store, size_mib)
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])))
