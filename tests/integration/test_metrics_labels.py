"""/metrics in process: labels stay bounded whatever a client sends, and one app's counters are
its own."""

from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import Api


def series(text: str, name: str) -> list[dict[str, str]]:
    return [
        s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    ]


async def scrape(api: Api) -> str:
    r = await api.call("GET", "/metrics")
    assert r.status_code == 200, r.text
    return r.text


async def test_requests_are_counted_by_template_never_by_path_or_odd_method(api: Api) -> None:
    """Job ids, unknown paths and made-up methods do not become label values."""
    for job_id in (1, 2, 987654321):
        await api.call("GET", f"/api/v1/jobs/{job_id}")
    await api.call("GET", "/no/such/route/abc123")
    await api.call("PROPFIND", "/api/v1/jobs")
    labels = series(await scrape(api), "berth_http_requests_total")
    routes = {x["route"] for x in labels}
    assert "/api/v1/jobs/{job_id}" in routes
    assert not any("987654321" in r or "abc123" in r for r in routes), routes
    assert {x["method"] for x in labels} <= {
        "GET",
        "HEAD",
        "POST",
        "PUT",
        "PATCH",
        "DELETE",
        "OPTIONS",
        "other",
    }
    got = {(x["route"], x["status"]) for x in labels}
    assert ("/api/v1/jobs/{job_id}", "404") in got


async def test_each_app_has_its_own_registry(api_with) -> None:
    """Two servers in one process do not add into each other's counters."""
    a = await api_with({"pools": {"gpu": {"slots": {"default": 1}}}})
    b = await api_with({"pools": {"gpu": {"slots": {"default": 1}}}})
    for _ in range(3):
        await a.call("GET", "/api/v1/jobs")
    count_a = [
        x
        for x in series(await scrape(a), "berth_http_requests_total")
        if x["route"] == "/api/v1/jobs"
    ]
    count_b = [
        x
        for x in series(await scrape(b), "berth_http_requests_total")
        if x["route"] == "/api/v1/jobs"
    ]
    assert count_a and not count_b
