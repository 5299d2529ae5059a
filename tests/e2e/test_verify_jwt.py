"""verify_jwt: berth checks the forwarded JWT against the issuer's JWKS instead of trusting
claim headers: signature, issuer, audience, expiry; an unknown key id refreshes the key set."""

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from joserfc import jwt
from joserfc.jwk import RSAKey

from tests.procs import wait_for

ISSUER = "https://idp.test/realms/berth"
AUDIENCE = "berth"


class Issuer:
    """A JWKS endpoint on loopback whose published keys the test can rotate."""

    def __init__(self) -> None:
        self.keys = [RSAKey.generate_key(2048, parameters={"kid": "k1", "alg": "RS256"})]
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(
                    {"keys": [k.as_dict(private=False) for k in issuer.keys]}
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/jwks"

    def token(self, key: RSAKey | None = None, **claims: object) -> str:
        key = key or self.keys[0]
        now = int(time.time())
        payload = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": "ci-pipeline",
            "iat": now,
            "exp": now + 300,
            "jti": uuid.uuid4().hex,
            **claims,
        }
        return jwt.encode({"alg": "RS256", "kid": key.kid}, payload, key)


def config(issuer: Issuer) -> dict:
    return {
        "network": {
            "auth": "proxy",
            "tls": "proxy",
            "proxy": {
                "verify_jwt": True,
                "jwks_url": issuer.url,
                "issuer": ISSUER,
                "audience": AUDIENCE,
                "claims": {"user": "x-auth-request-user", "principal": "x-jwt-sub"},
                "rules": [
                    {
                        "when": {"principal": "ci-pipeline"},
                        "caller": "service",
                        "role": "member",
                        "tenants": ["ml"],
                    },
                    {"when": {"groups": "berth-admins"}, "role": "admin"},
                ],
            },
        }
    }


class TestVerifyJwt:
    def test_claims_come_from_the_verified_token(self, server_factory):
        """A valid token is the caller; forged headers, bad signatures, audience and expiry are not."""
        issuer = Issuer()
        try:
            s = server_factory(config(issuer), builtin_worker=False)

            def get(token: str | None, **headers: str) -> httpx.Response:
                if token:
                    headers["authorization"] = f"Bearer {token}"
                return httpx.get(f"{s.url}/api/v1/jobs", headers=headers, timeout=10)

            assert get(issuer.token()).status_code == 200
            r = httpx.post(
                f"{s.url}/api/v1/jobs",
                json={"command": ["true"]},
                timeout=10,
                headers={"authorization": f"Bearer {issuer.token()}"},
            )
            assert r.json()["created_by"] == "service:ci-pipeline" and r.json()["tenant"] == "ml"
            # Headers are not claims when the token is verified: forging them gains nothing.
            assert get(None, **{"x-jwt-sub": "ci-pipeline"}).status_code == 401
            assert (
                get(issuer.token(sub="mallory"), **{"x-jwt-sub": "ci-pipeline"}).status_code == 403
            )
            admin = issuer.token(
                sub="root", preferred_username="root", groups=["dev", "berth-admins"]
            )
            assert (
                httpx.get(
                    f"{s.url}/api/v1/tokens",
                    timeout=10,
                    headers={"authorization": f"Bearer {admin}"},
                ).status_code
                == 200
            )
            stranger = RSAKey.generate_key(2048, parameters={"kid": "k1", "alg": "RS256"})
            assert get(issuer.token(key=stranger)).status_code == 401
            assert get(issuer.token(aud="someone-else")).status_code == 401
            assert get(issuer.token(exp=int(time.time()) - 3600)).status_code == 401
            assert get(issuer.token(iss="https://evil.test")).status_code == 401
            # Key rotation: a token under a newly published kid is accepted after a refresh,
            # which is rate-limited (one per 10 s): refused at first, accepted once it may.
            rotated = RSAKey.generate_key(2048, parameters={"kid": "k2", "alg": "RS256"})
            issuer.keys.append(rotated)
            assert get(issuer.token(key=rotated)).status_code == 401
            wait_for(
                lambda: get(issuer.token(key=rotated)).status_code == 200,
                15,
                "the rotated key to be fetched",
                every=0.5,
            )
        finally:
            issuer.httpd.shutdown()
