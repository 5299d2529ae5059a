"""Tenant isolation on every route: a member (or operator) of tenant alpha walks the whole
OpenAPI schema aimed at tenant bravo's job, logs, secret and blob, and gets nothing of bravo's."""

import hashlib
import re

import httpx

from tests.e2e.test_proxy_mode import call
from tests.procs import wait_for

CONFIG = {
    "pools": {"serve": {"builtin": True}},  # off by default behind a proxy (SPEC section 4)
    "network": {
        "auth": "proxy",
        "tls": "proxy",
        "proxy": {
            "claims": {"user": "x-auth-request-user", "groups": "x-auth-request-groups"},
            "name_claims": ["user"],
            "rules": [
                {"when": {"groups": "berth-admins"}, "role": "admin"},
                {
                    "when": {"groups": "ops-*"},
                    "role": "operator",
                    "tenants_from": "groups",
                    "tenant_prefix": "ops-",
                },
                {
                    "when": {"groups": "team-*"},
                    "role": "member",
                    "tenants_from": "groups",
                    "tenant_prefix": "team-",
                },
            ],
        },
    },
}
ADMIN = {"x-auth-request-user": "root", "x-auth-request-groups": "berth-admins"}
BRAVO = {"x-auth-request-user": "bo", "x-auth-request-groups": "team-bravo"}
ALPHA_MEMBER = {"x-auth-request-user": "al", "x-auth-request-groups": "team-alpha"}
ALPHA_OPERATOR = {"x-auth-request-user": "op", "x-auth-request-groups": "ops-alpha"}
MARK = "BRAVO-PRIVATE-7731"
SECRET = "bravo-secret-value-5521"
BLOB = f"{MARK} an artifact of bravo's".encode()
BLOB_SHA = hashlib.sha256(BLOB).hexdigest()


class TestTenancy:
    def test_alpha_cannot_reach_bravo_through_any_route(self, server_factory):
        """Every route, every method, as alpha's member and operator: nothing of bravo's leaks."""
        s = server_factory(CONFIG)
        r = call(
            s,
            "POST",
            "/api/v1/jobs",
            BRAVO,
            json={"command": ["sh", "-c", f"echo {MARK}; sleep 30"], "tenant": "bravo"},
        )
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        wait_for(
            lambda: MARK in call(s, "GET", f"/api/v1/jobs/{job}/logs", BRAVO).text, 20, "output"
        )
        r = call(
            s, "PUT", "/api/v1/secrets/bravo-key", ADMIN, json={"value": SECRET, "tenant": "bravo"}
        )
        assert r.status_code == 200, r.text
        r = call(s, "PUT", f"/api/v1/cas/{BLOB_SHA}", BRAVO, content=BLOB)
        assert r.status_code == 201, r.text
        schema = httpx.get(f"{s.url}/schema/openapi.json").json()
        values = {"job_id": str(job), "name": "bravo-key", "action": "drain", "sha256": BLOB_SHA}
        tried = 0
        for who in (ALPHA_MEMBER, ALPHA_OPERATOR):
            for path, ops in schema["paths"].items():
                for method in ops:
                    if method not in ("get", "head", "post", "put", "delete"):
                        continue
                    url = re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "x"), path)
                    body = {"value": "overwrite", "tenant": "bravo"} if method == "put" else None
                    if path == "/api/v1/jobs" and method == "post":
                        body = {"command": ["true"], "tenant": "bravo"}
                    for params in ({}, {"tenant": "bravo"}, {"follow": "true"}):
                        resp = call(s, method.upper(), url, who, json=body, params=params)
                        tried += 1
                        assert resp.status_code < 500, (method, url, resp.text)
                        assert MARK not in resp.text and SECRET not in resp.text, (method, url)
                        if resp.status_code < 300:  # (a refusal may echo the name alpha sent)
                            assert "bravo" not in resp.text, (method, url, resp.text)
        assert tried > 40
        # Nothing alpha tried changed bravo's job or secret.
        shown = call(s, "GET", f"/api/v1/jobs/{job}", ADMIN).json()
        assert shown["state"] in ("leased", "running")
        secrets = call(s, "GET", "/api/v1/secrets", ADMIN).json()
        assert any(x["name"] == "bravo-key" and x["tenant"] == "bravo" for x in secrets)
        # Knowing the hash is not enough; sending the bytes makes alpha a reference of its own.
        for who in (ALPHA_MEMBER, ALPHA_OPERATOR):
            for method in ("GET", "HEAD"):
                assert call(s, method, f"/api/v1/cas/{BLOB_SHA}", who).status_code == 404
        # Nor can a job of alpha's name it as an input: the same 404, no job made.
        r = call(
            s,
            "POST",
            "/api/v1/jobs",
            ALPHA_MEMBER,
            json={
                "command": ["true"],
                "tenant": "alpha",
                "inputs": [{"name": "stolen", "sha256": BLOB_SHA}],
            },
        )
        assert r.status_code == 404 and BLOB_SHA in r.text, r.text
        assert not call(s, "GET", "/api/v1/jobs", ADMIN, params={"tenant": "alpha"}).json()
        # Answered as an upload of a new blob: nothing says bravo stored it first.
        r = call(s, "PUT", f"/api/v1/cas/{BLOB_SHA}", ALPHA_MEMBER, content=BLOB)
        assert r.status_code == 201 and "bravo" not in r.text, r.text
        assert call(s, "GET", f"/api/v1/cas/{BLOB_SHA}", ALPHA_MEMBER).content == BLOB
        assert call(s, "GET", f"/api/v1/cas/{BLOB_SHA}", BRAVO).content == BLOB
        # And bravo still sees its own.
        assert MARK in call(s, "GET", f"/api/v1/jobs/{job}/logs", BRAVO).text
        assert call(s, "POST", f"/api/v1/jobs/{job}/cancel", BRAVO).json()["state"] == "cancelled"
