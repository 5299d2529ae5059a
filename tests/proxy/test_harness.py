"""The nginx front itself, against an echo upstream: what reaches the upstream, with no berth."""

import json
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.proxy.echo import Echo
from tests.proxy.harness import ProxyFront

FORGED = [
    ("X-Auth-Request-User", "admin"),
    ("x-auth-request-user", "admin2"),
    ("X-AUTH-REQUEST-GROUPS", "berth-admins"),
    ("X-Auth-Request-Principal", "ci-pipeline"),
    ("X-Auth-Request-Email", "root@evil"),
    ("X_Auth_Request_User", "underscore"),
]
CLAIMS = ("x-auth-request-", "x_auth")


@pytest.fixture(scope="module")
def echo() -> Iterator[Echo]:
    e = Echo().start()
    yield e
    e.stop()


@pytest.fixture(scope="module", params=[True, False], ids=["headers-more", "stock"])
def front(request, echo, tmp_path_factory) -> Iterator[ProxyFront]:
    prefix = tmp_path_factory.mktemp("nginx")
    with ProxyFront(prefix, echo.address, headers_more=request.param) as f:
        yield f


def seen(front: ProxyFront, *headers: tuple[str, str]) -> list[list[str]]:
    r = httpx.get(f"{front.url}/api/v1/whoami", headers=[*headers, *FORGED], timeout=10)
    assert r.status_code == 200, (r.status_code, r.text, front.log())
    return r.json()


def claims(pairs: list[list[str]]) -> list[list[str]]:
    return [p for p in pairs if p[0].startswith(CLAIMS)]


class TestClaimHeaders:
    def test_a_person_gets_exactly_the_stubs_claims(self, front):
        """alice's cookie: one copy of each claim from the stub, every forged copy gone."""
        assert claims(seen(front, ("Cookie", "session=alice"))) == [
            ["x-auth-request-user", "alice"],
            ["x-auth-request-email", "alice@example.com"],
            ["x-auth-request-groups", "berth-admins,dev"],
        ]

    def test_claims_the_stub_does_not_give_are_removed_not_passed(self, front):
        """mallory has no groups or principal: the forged ones do not survive."""
        assert claims(seen(front, ("Cookie", "session=mallory"))) == [
            ["x-auth-request-user", "mallory"],
            ["x-auth-request-email", "mallory@example.com"],
        ]

    def test_a_service_bearer_gives_a_principal_and_no_user(self, front):
        """The ci-pipeline secret: principal only; its Authorization header is forwarded."""
        pairs = seen(front, ("Authorization", "Bearer svc-ci-secret"))
        assert claims(pairs) == [["x-auth-request-principal", "ci-pipeline"]]
        assert ["authorization", "Bearer svc-ci-secret"] in pairs

    def test_a_brt_token_passes_with_no_claims_for_berth_to_refuse(self, front):
        """A brt_ bearer is let through claimless and reaches the upstream as sent."""
        pairs = seen(front, ("Authorization", "Bearer brt_abc"))
        assert claims(pairs) == []
        assert ["authorization", "Bearer brt_abc"] in pairs

    def test_the_worker_header_passes_through(self, front):
        """X-Berth-Worker is the client's own: nginx forwards it, berth decides."""
        pairs = seen(front, ("Cookie", "session=bob"), ("X-Berth-Worker", "gpu-w1"))
        assert ["x-berth-worker", "gpu-w1"] in pairs

    def test_unlisted_claim_headers_are_stripped_only_with_headers_more(self, front):
        """X-Auth-Request-Tenant has no proxy_set_header: only the wildcard strip removes it."""
        pairs = seen(front, ("Cookie", "session=bob"), ("X-Auth-Request-Tenant", "other"))
        assert (["x-auth-request-tenant", "other"] not in pairs) == front.headers_more


class TestRefusals:
    @pytest.mark.parametrize(
        "headers",
        [{}, {"Cookie": "session=eve"}, {"Authorization": "Bearer wrong"}],
        ids=["none", "unknown-session", "unknown-bearer"],
    )
    def test_no_valid_credential_is_a_plain_json_401(self, front, headers):
        """No credential (forged claims or not): 401 JSON from nginx, no login redirect."""
        r = httpx.get(f"{front.url}/api/v1/jobs", headers=[*headers.items(), *FORGED])
        assert r.status_code == 401
        assert "error" in r.json()


class TestWebsocket:
    def test_a_worker_upgrade_carries_its_claims_and_echoes(self, front):
        """The workers' bearer upgrades through nginx with its principal and worker header."""
        headers = {"Authorization": "Bearer workers-shared-secret", "X-Berth-Worker": "gpu-w1"}
        with connect(f"{front.ws_url}/api/v1/workers/attach", additional_headers=headers) as ws:
            pairs = json.loads(ws.recv())
            ws.send("ping")
            assert ws.recv() == "ping"
        assert claims(pairs) == [["x-auth-request-principal", "berth-workers"]]
        assert ["x-berth-worker", "gpu-w1"] in pairs

    def test_an_upgrade_without_credential_is_refused(self, front):
        """No credential: the handshake gets 401."""
        with pytest.raises(InvalidStatus) as e:
            connect(f"{front.ws_url}/api/v1/workers/attach", open_timeout=5)
        assert e.value.response.status_code == 401
