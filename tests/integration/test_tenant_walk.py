"""Tenant isolation on every route, in process: a member (or operator) of tenant alpha walks the
whole OpenAPI schema aimed at tenant bravo's job, logs, secret and blob, and gets nothing of
bravo's. Callers are the proxy's claim headers (auth = "proxy"); bravo's job runs on a fake
worker (tests/fakeworker.py) that prints bravo's mark."""

import hashlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from service import protocol
from service.domain.artifacts import server_store
from tests.fakeworker import FakeWorker, running
from tests.integration.conftest import KEY, Api, rebuilt

CONFIG = {
    "pools": {"gpu": {"slots": {"default": 2}}},
    "network": {
        "auth": "proxy",
        "tls": "proxy",
        "proxy": {
            "claims": {
                "user": "x-auth-request-user",
                "groups": "x-auth-request-groups",
                "principal": "x-jwt-sub",
            },
            "name_claims": ["user", "principal"],
            "worker_header": "x-berth-worker",
            "rules": [
                {"when": {"groups": "berth-admins"}, "role": "admin"},
                {"when": {"principal": "berth-workers"}, "caller": "worker"},
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
WORKER = {"x-jwt-sub": "berth-workers", "x-berth-worker": "gpu-1"}
MARK = "BRAVO-PRIVATE-7731"
SECRET = "bravo-secret-value-5521"
BLOB = f"{MARK} an artifact of bravo's".encode()
BLOB_SHA = hashlib.sha256(BLOB).hexdigest()


@pytest.fixture
async def proxied(
    api_with: Callable[[dict[str, Any]], Awaitable[Api]], db_url: str, tmp_path: Path
) -> AsyncIterator[Api]:
    api = await api_with(CONFIG)
    api = rebuilt(
        api, cas=server_store.open_server_store(api.rt.config, home=tmp_path, secret_key=KEY)
    )
    async with running(api, db_url):
        yield api


async def call(api: Api, method: str, path: str, who: dict[str, str], **kw: Any) -> httpx.Response:
    return await api.client.request(method, path, headers=who, **kw)


class TestTenancy:
    async def test_alpha_cannot_reach_bravo_through_any_route(self, proxied: Api):
        """Every route, every method, as alpha's member and operator: nothing of bravo's leaks."""
        s = proxied
        worker = FakeWorker(app=s.app, headers=WORKER)
        await worker.connect()
        r = await call(
            s, "POST", "/api/v1/jobs", BRAVO, json={"command": ["true"], "tenant": "bravo"}
        )
        assert r.status_code == 201, r.text
        job = r.json()["id"]
        lease = await worker.lease()
        assert (lease.job, lease.tenant) == (job, "bravo")
        await worker.report(protocol.Started(seq=worker.next_seq(), job=job, epoch=1))
        await worker.report(
            protocol.Output(
                seq=worker.next_seq(),
                job=job,
                epoch=1,
                stream="stdout",
                data=f"{MARK}\n".encode(),
            )
        )
        assert MARK in (await call(s, "GET", f"/api/v1/jobs/{job}/logs", BRAVO)).text
        r = await call(
            s, "PUT", "/api/v1/secrets/bravo-key", ADMIN, json={"value": SECRET, "tenant": "bravo"}
        )
        assert r.status_code == 200, r.text
        r = await call(s, "PUT", f"/api/v1/cas/{BLOB_SHA}", BRAVO, content=BLOB)
        assert r.status_code == 201, r.text
        schema = (await s.client.get("/schema/openapi.json")).json()
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
                        resp = await call(s, method.upper(), url, who, json=body, params=params)
                        tried += 1
                        assert resp.status_code < 500, (method, url, resp.text)
                        assert MARK not in resp.text and SECRET not in resp.text, (method, url)
                        if resp.status_code < 300:  # (a refusal may echo the name alpha sent)
                            assert "bravo" not in resp.text, (method, url, resp.text)
        assert tried > 40
        # Nothing alpha tried changed bravo's job or secret.
        shown = (await call(s, "GET", f"/api/v1/jobs/{job}", ADMIN)).json()
        assert (shown["state"], shown["attempt"]) == ("running", 1)
        secrets = (await call(s, "GET", "/api/v1/secrets", ADMIN)).json()
        assert any(x["name"] == "bravo-key" and x["tenant"] == "bravo" for x in secrets)
        # Knowing the hash is not enough; sending the bytes makes alpha a reference of its own.
        for who in (ALPHA_MEMBER, ALPHA_OPERATOR):
            for method in ("GET", "HEAD"):
                r = await call(s, method, f"/api/v1/cas/{BLOB_SHA}", who)
                assert r.status_code == 404, (who, method, r.status_code)
        # Nor can a job of alpha's name it as an input: the same 404, no job made.
        r = await call(
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
        assert not (await call(s, "GET", "/api/v1/jobs", ADMIN, params={"tenant": "alpha"})).json()
        # Answered as an upload of a new blob: nothing says bravo stored it first.
        r = await call(s, "PUT", f"/api/v1/cas/{BLOB_SHA}", ALPHA_MEMBER, content=BLOB)
        assert r.status_code == 201 and "bravo" not in r.text, r.text
        assert (await call(s, "GET", f"/api/v1/cas/{BLOB_SHA}", ALPHA_MEMBER)).content == BLOB
        assert (await call(s, "GET", f"/api/v1/cas/{BLOB_SHA}", BRAVO)).content == BLOB
        # And bravo still sees its own, and cancels it: the worker is told.
        assert MARK in (await call(s, "GET", f"/api/v1/jobs/{job}/logs", BRAVO)).text
        r = await call(s, "POST", f"/api/v1/jobs/{job}/cancel", BRAVO)
        assert r.json()["state"] == "cancelled"
        cancel = await worker.next(protocol.Cancel)
        assert (cancel.job, cancel.epoch) == (job, 1)
