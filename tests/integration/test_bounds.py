"""Bounds where input enters the API: every hostile body, path and query is a 4xx naming the
problem, never a 5xx, and changes nothing."""

import pytest

from tests.integration.conftest import Api

JOB = {"command": ["true"]}


def job(**fields: object) -> dict:
    return {**JOB, **fields}


HOSTILE_JOBS = [
    pytest.param(job(priority=2**40), "$.priority", id="priority-2**40"),
    pytest.param(job(priority=-(2**40)), "$.priority", id="priority--2**40"),
    pytest.param(job(max_attempts=2**40), "$.max_attempts", id="max-attempts"),
    pytest.param(job(max_attempts=0), "$.max_attempts", id="zero-attempts"),
    pytest.param(job(command=["echo", "a\x00b"]), "$.command[1]", id="nul-in-command"),
    pytest.param(job(env={"A": "x\x00y"}), "$.env", id="nul-in-env-value"),
    pytest.param(job(env={"A\x00": "x"}), "$.env", id="nul-in-env-name"),
    pytest.param(job(labels=["cu\x00da"]), "$.labels[0]", id="nul-in-label"),
    pytest.param(job(labels=["a,b"]), "$.labels[0]", id="comma-in-label"),
    pytest.param(job(labels=["x"] * 65), "$.labels", id="too-many-labels"),
    pytest.param(job(kind="de\x00fault"), "$.kind", id="nul-in-kind"),
    pytest.param(job(pool="g\x00pu"), "$.pool", id="nul-in-pool"),
    pytest.param(job(tenant="a\x00"), "$.tenant", id="nul-in-tenant"),
    pytest.param(job(tenant="x" * 200), "$.tenant", id="long-tenant"),
    pytest.param({"python": "print(1)\x00"}, "$.python", id="nul-in-python"),
    pytest.param(job(secrets={"K": "na\x00me"}), "$.secrets", id="nul-in-secret-name"),
    pytest.param(job(timeout_seconds=1e300), "$.timeout_seconds", id="huge-timeout"),
    pytest.param(job(device_policy="maybe"), "$.device_policy", id="bad-policy"),
    pytest.param(job(command=["x"] * 5000), "$.command", id="too-many-args"),
    pytest.param(job(command=["x" * (200 * 1024)]), "$.command[0]", id="huge-arg"),
]


class TestJobBodies:
    @pytest.mark.parametrize(("body", "field"), HOSTILE_JOBS)
    async def test_hostile_job_is_a_400_naming_the_field(self, api: Api, body, field):
        """Out of bounds, NUL or too long: 400 naming the field, and no job appears."""
        r = await api.call("POST", "/api/v1/jobs", json=body)
        assert r.status_code == 400, r.text
        assert field in r.json()["error"]
        assert (await api.call("GET", "/api/v1/jobs")).json() == []

    async def test_infinite_timeout_is_refused(self, api: Api):
        """1e400 decodes as infinity: refused, not stored."""
        r = await api.call(
            "POST",
            "/api/v1/jobs",
            content=b'{"command": ["true"], "timeout_seconds": 1e400}',
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400 and "$.timeout_seconds" in r.json()["error"]

    async def test_batch_with_one_bad_job_changes_nothing(self, api: Api):
        """A list with one hostile job is refused whole."""
        r = await api.call("POST", "/api/v1/jobs", json=[JOB, job(priority=2**40)])
        assert r.status_code == 400 and "priority" in r.json()["error"]
        assert (await api.call("GET", "/api/v1/jobs")).json() == []

    async def test_edges_still_fit(self, api: Api):
        """The largest values within bounds are accepted and stored as given."""
        r = await api.call(
            "POST",
            "/api/v1/jobs",
            json=job(priority=2**31 - 1, max_attempts=100, labels=["é-ünïcode=1"], pool="gpu"),
        )
        assert r.status_code == 201, r.text
        assert r.json()["priority"] == 2**31 - 1


class TestOtherBodies:
    @pytest.mark.parametrize(
        ("body", "field"),
        [
            ({"name": "a\x00b"}, "$.name"),
            ({"name": "ok", "kind": "root"}, "$.kind"),
            ({"name": "ok", "expires_days": 1e300}, "$.expires_days"),
            ({"name": "ok", "expires_days": 0}, "$.expires_days"),
            ({"name": "ok", "tenants": ["t\x00"]}, "$.tenants[0]"),
        ],
    )
    async def test_tokens(self, api: Api, body, field):
        """A hostile token body is a 400 naming the field; no token is made."""
        r = await api.call("POST", "/api/v1/tokens", json=body)
        assert r.status_code == 400 and field in r.json()["error"], r.text
        names = {t["name"] for t in (await api.call("GET", "/api/v1/tokens")).json()}
        assert names == {"admin"}

    @pytest.mark.parametrize("name", ["cas", "attach", "join-tokens"])
    async def test_worker_names_the_routes_use(self, api: Api, name):
        """A worker named like a fixed path under /api/v1/workers/ could not be drained: 4xx."""
        r = await api.call("POST", "/api/v1/tokens", json={"name": name, "kind": "worker"})
        assert 400 <= r.status_code < 500 and "reserved" in r.json()["error"], r.text
        r = await api.call(
            "POST", "/api/v1/workers/join-tokens", json={"pool": "serve", "name": name}
        )
        assert 400 <= r.status_code < 500 and "reserved" in r.json()["error"], r.text
        names = {t["name"] for t in (await api.call("GET", "/api/v1/tokens")).json()}
        assert names == {"admin"}

    @pytest.mark.parametrize(
        ("body", "field"),
        [({"value": "a\x00b"}, "$.value"), ({"value": "x", "tenant": "t\x00"}, "$.tenant")],
    )
    async def test_secrets(self, api: Api, body, field):
        """A secret value with a NUL cannot become an environment variable: 400."""
        r = await api.call("PUT", "/api/v1/secrets/k", json=body)
        assert r.status_code == 400 and field in r.json()["error"], r.text
        assert (await api.call("GET", "/api/v1/secrets")).json() == []


class TestUrls:
    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("GET", "/api/v1/jobs?tenant=%00"),
            ("GET", "/api/v1/jobs?state=%00"),
            ("GET", "/api/v1/jobs?tenant=a%00b"),
            ("POST", "/api/v1/workers/w%00/drain"),
            ("DELETE", "/api/v1/tokens/t%00"),
            ("DELETE", "/api/v1/secrets/k?tenant=%00"),
            ("PUT", "/api/v1/secrets/k%00"),
        ],
    )
    async def test_nul_anywhere_in_the_url(self, api: Api, method, path):
        """A NUL in a path or query is a 400 saying so, before any query runs."""
        kw = {"json": {"value": "v"}} if method == "PUT" else {}
        r = await api.call(method, path, **kw)
        assert r.status_code == 400, r.text
        assert "NUL" in r.json()["error"]

    @pytest.mark.parametrize(
        ("path", "words"),
        [
            ("/api/v1/jobs?limit=99999999999999999999999", "limit"),
            ("/api/v1/jobs?limit=0", "limit"),
            ("/api/v1/jobs?tenant=" + "x" * 300, "tenant"),
            ("/api/v1/jobs/1/logs?after=99999999999999999999999", ""),
            ("/api/v1/jobs/1/logs?after=-1", "after"),
            ("/api/v1/jobs/1/logs?encoding=latin1", "encoding"),
            ("/api/v1/audit?limit=-5", "limit"),
        ],
    )
    async def test_query_out_of_bounds(self, api: Api, path, words):
        """Numbers and names outside what berth stores are a 4xx, never a 5xx."""
        await api.call("POST", "/api/v1/jobs", json=JOB)
        r = await api.call("GET", path)
        assert 400 <= r.status_code < 500, (r.status_code, r.text)
        assert words in r.json()["error"]


class TestErrorField:
    @pytest.mark.parametrize(
        ("method", "path", "raw", "field"),
        [
            ("POST", "/api/v1/jobs", b'{"command": ["true"], "max_attempts": 0}', "max_attempts"),
            ("POST", "/api/v1/jobs", b'{"command": ["true"], "max_attempts": "3"}', "max_attempts"),
            ("POST", "/api/v1/jobs", b'{"comand": ["true"]}', "comand"),
            (
                "POST",
                "/api/v1/jobs",
                b'[{"command": ["a"]}, {"command": ["b"], "priority": 2e40}]',
                "[1].priority",
            ),
            (
                "POST",
                "/api/v1/jobs",
                b'{"command": ["true"], "inputs": [{"name": "..", "sha256": "x"}]}',
                "inputs[0].name",
            ),
            ("POST", "/api/v1/jobs", b'{"command": ["true"], "env": {"1BAD": "x"}}', "env"),
            ("POST", "/api/v1/jobs", b'{"python": "x", "command": ["y"]}', "command"),
            ("GET", "/api/v1/jobs?limit=0", b"", "limit"),
            ("GET", "/api/v1/jobs?state=bogus", b"", "state"),  # the wire's name, not the code's
            ("GET", "/api/v1/audit?limit=x", b"", "limit"),
            ("PUT", "/api/v1/secrets/k", b'{"value": "v", "tenant": "a b"}', "tenant"),
        ],
    )
    async def test_a_400_names_the_field_at_fault(self, api: Api, method, path, raw, field):
        """The one error shape: `error`, `status` and the offending `field`."""
        headers = {"content-type": "application/json"}
        r = await api.call(method, path, content=raw or None, headers=headers)
        assert r.status_code == 400, r.text
        assert r.json()["status"] == 400 and r.json()["field"] == field, r.text

    async def test_an_unknown_pool_is_a_404_naming_the_field(self, api: Api):
        """A pool is a thing that exists or not: 404, with the field at fault."""
        r = await api.call("POST", "/api/v1/jobs", json={"command": ["true"], "pool": "nope"})
        assert r.status_code == 404 and r.json()["field"] == "pool", r.text

    @pytest.mark.parametrize("raw", [b"", b"  ", b"{nope"])
    async def test_no_body_or_no_json_names_no_field(self, api: Api, raw):
        """A missing or malformed body is said so, with no field to name."""
        r = await api.call(
            "POST", "/api/v1/tokens", content=raw, headers={"content-type": "application/json"}
        )
        assert r.status_code == 400 and "field" not in r.json(), r.text
        assert "JSON" in r.json()["error"]
