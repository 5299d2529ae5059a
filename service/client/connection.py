"""How a client reaches the server: URL, credential, TLS and timeouts, the same sync or async.

- `token`: a berth token (`brt_...`), sent as `Authorization: Bearer`.
- `headers`: sent with every request. Behind a proxy (`[network] auth = "proxy"`) berth takes
  no token: pass what the proxy authenticates instead (its cookie, or the identity provider's
  bearer token), and no `token`.
- `ca`: a CA bundle (PEM) to verify the server's certificate with, for a private CA. Without
  it the system's store is used, or `SSL_CERT_FILE` when set (as for the `berth` command).
- `transport`: an httpx transport, e.g. `httpx.ASGITransport(app)` to call an app in-process.
"""

import ssl
from pathlib import Path
from typing import Any

import httpx

# No read timeout by default: a followed output or a large blob streams for as long as it takes.
TIMEOUT = httpx.Timeout(30.0, read=None)


def options(
    url: str,
    token: str | None,
    *,
    headers: dict[str, str] | None,
    ca: str | Path | None,
    timeout: httpx.Timeout | float,
) -> dict[str, Any]:
    """The keyword arguments of the httpx client, `httpx.Client` or `httpx.AsyncClient`."""
    sent = dict(headers or {})
    if token:
        sent["Authorization"] = f"Bearer {token}"
    verify: ssl.SSLContext | bool = True
    if ca is not None:
        verify = ssl.create_default_context(cafile=str(ca))
    return {
        "base_url": url.rstrip("/"),
        "headers": sent,
        "verify": verify,
        "timeout": timeout,
    }
