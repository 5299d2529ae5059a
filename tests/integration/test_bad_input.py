"""Bad input to the API, in process: a 4xx with a JSON body naming the problem, and nothing
changed. (The CLI's one-line errors and `berth serve`'s refusals are process tests:
tests/e2e/test_bad_input.py.)"""

import pytest

from tests.integration.conftest import Api

BAD_BODIES = [
    pytest.param(b"{not json", "malformed JSON", id="malformed"),
    pytest.param(b'{"comand": ["true"]}', "comand", id="unknown-field"),
    pytest.param(b'{"command": "true"}', "command", id="wrong-type"),
    pytest.param(
        b'{"command": ["true"], "max_attempts": "3"}', "max_attempts", id="wrong-type-int"
    ),
    pytest.param(b'{"command": []}', "exactly one of command", id="empty-command"),
    pytest.param(
        b'{"command": ["true"], "pool": "nope"}', "unknown pool 'nope'", id="unknown-pool"
    ),
    pytest.param(
        b'{"command": ["true"], "kind": "eval"}',
        "no pool has slots of kind 'eval' (kinds by pool: gpu: default; serve: default)",
        id="unknown-kind",
    ),
    pytest.param(b'{"command": ["true"], "env": {"1BAD": "x"}}', "1BAD", id="bad-env-name"),
    pytest.param(
        b'{"command": ["true"], "timeout_seconds": -1}', "timeout_seconds", id="negative-timeout"
    ),
    pytest.param(b"[]", "no jobs given", id="empty-batch"),
    pytest.param(b"", "JSON body is required", id="empty-body"),
]


class TestBodies:
    async def test_bad_submits_are_400s_naming_the_problem_and_change_nothing(self, api: Api):
        """Each malformed submit is a 400 with a JSON error naming the problem; no job appears.
        (One database for all: each case is a request, not a test's worth of setup.)"""
        for case in BAD_BODIES:
            raw, words = case.values
            r = await api.call(
                "POST", "/api/v1/jobs", content=raw, headers={"content-type": "application/json"}
            )
            assert r.status_code == 400, (case.id, r.status_code, r.text)
            assert words in r.json()["error"], (case.id, r.json())
        assert (await api.call("GET", "/api/v1/jobs")).json() == []


class TestUnknown:
    async def test_unknown_ids_routes_actions_and_states(self, api: Api):
        """Unknown job ids, workers, tokens and routes are 404s with a JSON body; an unknown
        worker action or job state is a 4xx naming it."""
        for method, path in [
            ("GET", "/api/v1/jobs/999"),
            ("GET", "/api/v1/jobs/99999999999999999999"),
            ("POST", "/api/v1/jobs/999/cancel"),
            ("GET", "/api/v1/jobs/999/logs"),
            ("POST", "/api/v1/workers/nobody/drain"),
            ("DELETE", "/api/v1/tokens/nobody"),
            ("GET", "/api/v1/nothing-here"),
        ]:
            r = await api.call(method, path)
            assert r.status_code == 404, (path, r.status_code, r.text)
            assert "error" in r.json()
        r = await api.call("POST", "/api/v1/workers/w1/explode")
        assert r.status_code in (400, 404) and "error" in r.json()
        r = await api.call("GET", "/api/v1/jobs", params={"state": "bogus"})
        assert r.status_code == 400 and "bogus" in r.json()["error"]


class TestCredentials:
    async def test_missing_unknown_and_misused_credentials(self, api: Api):
        """No token, a bad token and a worker token on a user route are 401/401/403 with JSON;
        health and the schema need none."""
        assert (await api.client.get("/api/v1/jobs")).status_code == 401
        r = await api.call("GET", "/api/v1/jobs", token="brt_" + "y" * 43)
        assert r.status_code == 401 and r.json()["error"] == "unknown token"
        worker = await api.mint("w9", "worker")
        r = await api.call("GET", "/api/v1/jobs", token=worker)
        assert r.status_code == 403 and "error" in r.json()
        assert (await api.client.get("/healthz")).json() == {"status": "ok"}
        schema = await api.client.get("/schema/openapi.json")
        assert schema.status_code == 200 and "/api/v1/jobs" in schema.json()["paths"]

    async def test_a_revoked_token_stops_working_at_once(self, api: Api):
        """A token used a moment ago (and so cached) is refused right after its revocation."""
        ci = await api.mint("ci", "service")
        assert (await api.call("GET", "/api/v1/jobs", token=ci)).status_code == 200
        assert (await api.call("DELETE", "/api/v1/tokens/ci")).status_code == 200
        r = await api.call("GET", "/api/v1/jobs", token=ci)
        assert (r.status_code, r.json()["error"]) == (401, "token revoked")

    async def test_a_duplicate_token_name_is_a_conflict(self, api: Api):
        """A second live token with the same name is a 409, and the first still works."""
        first = await api.mint("dup", "worker")
        r = await api.call("POST", "/api/v1/tokens", json={"name": "dup", "kind": "worker"})
        assert r.status_code == 409 and "name" in r.json()["error"]
        r = await api.call("POST", "/api/v1/tokens", json={"name": "bad name!", "kind": "worker"})
        assert r.status_code == 400
        listed = (await api.call("GET", "/api/v1/tokens")).json()
        assert [t["name"] for t in listed if t["name"] == "dup"] == ["dup"]
        assert first.startswith("brt_")
