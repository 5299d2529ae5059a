"""How the client reads an error answer: berth's one shape (error, status, field), and
whatever else a proxy in front of it may answer with."""

import httpx
import pytest

from service.client import ApiError, BerthClient, JobRequest
from service.core.errors import BerthError


def client_answering(status: int, body: bytes, content_type: str) -> BerthClient:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": content_type})

    return BerthClient("http://berth.test", "brt_x", transport=httpx.MockTransport(handler))


def test_the_field_at_fault_is_kept() -> None:
    body = b'{"error": "max_attempts must be at least 1", "status": 400, "field": "max_attempts"}'
    with client_answering(400, body, "application/json") as client, pytest.raises(ApiError) as exc:
        client.submit_job(JobRequest(command=["true"], max_attempts=0))
    assert (exc.value.status, exc.value.error, exc.value.field) == (
        400,
        "max_attempts must be at least 1",
        "max_attempts",
    )
    assert isinstance(exc.value, BerthError) and exc.value.message == exc.value.error


def test_a_proxy_page_is_named_by_its_status() -> None:
    page = client_answering(502, b"<html>Bad Gateway</html>", "text/html")
    with page as client, pytest.raises(ApiError) as exc:
        client.workers()
    assert (exc.value.status, exc.value.error, exc.value.field) == (502, "HTTP 502", None)


def test_only_what_is_set_is_sent() -> None:
    """A JobRequest sends the fields given, so the server's defaults apply to the rest."""
    seen: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.read())
        assert request.headers["authorization"] == "Bearer brt_x"
        return httpx.Response(404, json={"error": "no pool gpu", "status": 404})

    client = BerthClient("http://berth.test/", "brt_x", transport=httpx.MockTransport(handler))
    with client, pytest.raises(ApiError):
        client.submit_job(JobRequest(command=["echo", "hi"], pool="gpu"))
    assert seen == [b'{"command":["echo","hi"],"pool":"gpu"}']
