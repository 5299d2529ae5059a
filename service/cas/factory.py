"""The store a `[cas]` config describes.

Opening makes no network call and touches no disk: a config that cannot work is refused here with
a one-line ValueError naming the key, and anything that needs the store itself (its id, a
missing bucket, a wrong credential) shows on first use.
"""

from collections.abc import Mapping
from pathlib import Path

from service.cas.base import Store
from service.cas.cached import CachedStore
from service.cas.http import NO_HEADERS, HttpStore
from service.cas.local import LocalStore
from service.config import Cas

GB = 1_000_000_000  # local_max_gb counts decimal gigabytes, like disk sizes


def open_store(
    cfg: Cas,
    *,
    home: Path,
    headers: Mapping[str, str] = NO_HEADERS,
    verify: str | None = None,
    expected_id: str | None = None,
) -> Store:
    """The store for `cfg`; `home` is $BERTH_HOME, `headers` authenticate to an http remote.

    `verify` is a CA file for an https remote; `expected_id` makes the remote's `id()` refuse
    a store other than that one.
    """
    root = Path(cfg.root).expanduser() if cfg.root else None
    match cfg.provider:
        case "local":
            return LocalStore(root or home / "cas")
        case "http":
            if not cfg.url:
                raise ValueError('[cas] url is required with provider = "http"')
            return HttpStore(cfg.url, headers=headers, verify=verify, expected_id=expected_id)
        case "cached":
            if not cfg.url:
                raise ValueError('[cas] url is required with provider = "cached"')
            if not cfg.local_max_gb > 0:
                raise ValueError('[cas] local_max_gb must be above 0 with provider = "cached"')
            remote = HttpStore(cfg.url, headers=headers, verify=verify, expected_id=expected_id)
            local = LocalStore(root or home / "cas-cache")
            return CachedStore(local, remote, max_bytes=int(cfg.local_max_gb * GB))
        case "s3":
            if not cfg.bucket:
                raise ValueError('[cas] bucket is required with provider = "s3"')
            from service.cas.s3 import S3Store  # noqa: PLC0415  (the s3 extra, only for s3)

            return S3Store(
                cfg.bucket,
                prefix=cfg.prefix,
                endpoint_url=cfg.endpoint_url,
                region=cfg.region,
            )
    raise ValueError(f"[cas] provider: unknown store {cfg.provider!r}")
