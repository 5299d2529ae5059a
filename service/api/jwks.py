"""The issuer's JWKS, fetched over HTTP and cached.

Refreshed when a token names an unknown key, at most every MIN_REFRESH seconds, so a flood of
made-up key ids cannot hammer the issuer.
"""

import asyncio
import time

import httpx
from joserfc.jwk import KeySet

from service.auth import jwt as jwt_auth
from service.core.errors import Unauthenticated, Unavailable

MIN_REFRESH = 10.0
MAX_AGE = 600.0


class Jwks:
    def __init__(self, url: str) -> None:
        self._url = url
        self._keys: KeySet | None = None
        self._fetched = 0.0
        self._lock = asyncio.Lock()

    async def _fetch(self) -> KeySet:
        async with self._lock:
            try:
                async with httpx.AsyncClient(timeout=5) as client:
                    r = await client.get(self._url)
                    r.raise_for_status()
                    self._keys = KeySet.import_key_set(r.json())
            except (httpx.HTTPError, ValueError) as exc:
                raise Unavailable(f"cannot fetch the issuer's keys: {exc}") from None
            self._fetched = time.monotonic()
            return self._keys

    async def keys(self) -> KeySet:
        if self._keys is None or time.monotonic() - self._fetched > MAX_AGE:
            return await self._fetch()
        return self._keys

    async def verify(self, token: str, *, issuer: str, audience: str) -> dict[str, object]:
        """Verify with the cached keys; on an unknown key id, refresh once and try again."""
        try:
            return dict(jwt_auth.verify(token, await self.keys(), issuer=issuer, audience=audience))
        except jwt_auth.UnknownKey:
            if time.monotonic() - self._fetched < MIN_REFRESH:
                raise Unauthenticated("token signed by an unknown key") from None
            keys = await self._fetch()
            return dict(jwt_auth.verify(token, keys, issuer=issuer, audience=audience))
