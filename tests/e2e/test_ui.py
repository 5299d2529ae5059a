"""The web UI over HTTP (no browser): sign-in, every page, tenant filters, CSRF and origins.

tests/e2e/test_ui_browser.py drives the same pages in a real browser through nginx.
"""

import re

import httpx
import pytest

from tests.procs import Server, wait_for

PAGES = ["/ui/jobs", "/ui/workers", "/ui/pools", "/ui/audit"]


def browser(s: Server) -> httpx.Client:
    """A client that keeps cookies, as a browser does, and sends its own Origin on writes."""
    return httpx.Client(base_url=s.url, timeout=30, follow_redirects=False)


def sign_in(s: Server, token: str) -> httpx.Client:
    c = browser(s)
    r = c.post("/ui/login", data={"token": token}, headers={"origin": s.url})
    assert r.status_code == 303 and r.headers["location"] == "/ui/jobs", r.text
    return c


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, html[:2000]
    return found.group(1)


@pytest.fixture
def ui(server_factory) -> Server:
    return server_factory({"pools": {"gpu": {"slots": {"default": 1}}}})


class TestSignIn:
    def test_a_page_without_a_session_goes_to_the_login_form(self, ui):
        r = browser(ui).get("/ui/jobs")
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"
        form = browser(ui).get("/ui/login")
        assert form.status_code == 200 and 'name="token"' in form.text

    def test_login_sets_a_strict_httponly_cookie_and_never_puts_the_token_in_a_url(self, ui):
        c = browser(ui)
        r = c.post("/ui/login", data={"token": ui.token}, headers={"origin": ui.url})
        assert r.status_code == 303
        cookie = r.headers["set-cookie"]
        assert (
            "berth_ui=" in cookie and "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
        )
        assert "Path=/ui" in cookie and "Secure" not in cookie  # plain HTTP here
        assert ui.token not in cookie and ui.token not in r.headers["location"]
        page = c.get("/ui/jobs")
        assert page.status_code == 200 and ui.token not in page.text

    def test_a_wrong_token_is_refused_with_the_form_again(self, ui):
        r = browser(ui).post("/ui/login", data={"token": "brt_nope"}, headers={"origin": ui.url})
        assert r.status_code == 401 and "not valid" in r.text and "set-cookie" not in r.headers

    def test_a_forged_cookie_is_no_session(self, ui):
        c = browser(ui)
        c.cookies.set("berth_ui", "AAAA" * 20, path="/ui")
        assert c.get("/ui/jobs").status_code == 303

    def test_the_cookie_does_not_authenticate_the_api(self, ui):
        """The session is for /ui alone: the API still wants its bearer token."""
        c = sign_in(ui, ui.token)
        cookie = c.cookies.get("berth_ui")
        r = httpx.get(f"{ui.url}/api/v1/jobs", cookies={"berth_ui": cookie})
        assert r.status_code == 401

    def test_a_revoked_token_ends_its_session(self, ui):
        made = ui.cli("token", "create", "op", "--kind", "operator")
        c = sign_in(ui, made.out.strip())
        assert c.get("/ui/workers").status_code == 200
        assert ui.cli("token", "revoke", "op").code == 0
        wait_for(lambda: c.get("/ui/workers").status_code == 303, 20, "the session to end")


class TestPages:
    def test_every_page_renders_and_says_what_is_empty(self, ui):
        c = sign_in(ui, ui.token)
        for path in PAGES:
            r = c.get(path)
            assert r.status_code == 200, (path, r.text[:500])
            assert "text/html" in r.headers["content-type"]
        assert "No jobs yet" in c.get("/ui/jobs").text
        assert "No job you may see matches" in c.get("/ui/jobs?state=failed").text
        assert "No entry matches" in c.get("/ui/audit?action=nothing.like.this").text
        assert "No limit set" in c.get("/ui/pools").text
        assert c.get("/ui/static/htmx.min.js").status_code == 200
        assert c.get("/ui/static/berth.css").status_code == 200
        assert c.get("/ui/static/nope.js").status_code == 404

    def test_a_job_page_and_its_filters(self, ui):
        c = sign_in(ui, ui.token)
        r = ui.api("POST", "/api/v1/jobs", json={"command": ["sh", "-c", "echo hi-there"]})
        job = r.json()["id"]
        wait_for(
            lambda: ui.api("GET", f"/api/v1/jobs/{job}").json()["state"] == "succeeded",
            60,
            "the job",
        )
        page = c.get(f"/ui/jobs/{job}")
        assert page.status_code == 200 and "hi-there" in page.text
        assert "serve-" in page.text  # the worker, and its attempt
        listed = c.get("/ui/jobs", params={"state": "succeeded", "creator": "human:admin"})
        assert f"/ui/jobs/{job}" in listed.text
        assert f"/ui/jobs/{job}" not in c.get("/ui/jobs", params={"pool": "gpu"}).text
        bad = c.get("/ui/jobs", params={"state": "bogus"})
        assert bad.status_code == 400 and "unknown state" in bad.text
        assert c.get("/ui/jobs/999999").status_code == 404
        verify = c.get("/ui/audit/verify", headers={"hx-request": "true"})
        assert verify.status_code == 200 and ("Intact" in verify.text or "Broken" in verify.text)

    def test_a_member_sees_its_tenant_only_and_no_fleet_buttons(self, ui):
        ids = {}
        for tenant in ("a", "b"):
            r = ui.api(
                "POST", "/api/v1/jobs", json={"command": ["true"], "tenant": tenant, "pool": "gpu"}
            )
            assert r.status_code == 201, r.text
            ids[tenant] = r.json()["id"]
        member = ui.cli("token", "create", "mb", "--kind", "service", "--tenant", "b").out.strip()
        c = sign_in(ui, member)
        jobs = c.get("/ui/jobs").text
        assert 'data-tenant="b"' in jobs and 'data-tenant="a"' not in jobs
        assert 'data-tenant="a"' not in c.get("/ui/jobs", params={"tenant": "a"}).text
        theirs = ids["a"]
        for path in (
            f"/ui/jobs/{theirs}",
            f"/ui/jobs/{theirs}/output",
            f"/ui/jobs/{theirs}/files/{'0' * 64}",
        ):
            assert c.get(path).status_code == 404, path
        token = csrf_of(c.get(f"/ui/jobs/{ids['b']}").text)
        refused = c.post(
            f"/ui/jobs/{theirs}/cancel", data={"csrf": token}, headers={"origin": ui.url}
        )
        assert refused.status_code == 404
        assert ui.api("GET", f"/api/v1/jobs/{theirs}").json()["state"] == "queued"
        assert 'data-action="drain"' not in c.get("/ui/workers").text
        assert c.get("/ui/audit").status_code == 403
        admin = sign_in(ui, ui.token)
        everything = admin.get("/ui/jobs").text
        assert 'data-tenant="a"' in everything and 'data-tenant="b"' in everything
        assert 'data-action="drain"' in admin.get("/ui/workers").text


class TestWrites:
    def _queued(self, ui: Server) -> int:
        r = ui.api("POST", "/api/v1/jobs", json={"command": ["true"], "pool": "gpu"})
        return int(r.json()["id"])

    def test_cancel_with_the_pages_csrf_token(self, ui):
        job = self._queued(ui)
        c = sign_in(ui, ui.token)
        token = csrf_of(c.get(f"/ui/jobs/{job}").text)
        r = c.post(f"/ui/jobs/{job}/cancel", data={"csrf": token}, headers={"origin": ui.url})
        assert r.status_code == 303 and r.headers["location"] == f"/ui/jobs/{job}"
        assert ui.api("GET", f"/api/v1/jobs/{job}").json()["state"] == "cancelled"
        audit = ui.api("GET", "/api/v1/audit").json()
        assert any(e["action"] == "job.cancelled" and e["target"] == str(job) for e in audit)

    def test_without_csrf_or_from_another_origin_nothing_changes(self, ui):
        job = self._queued(ui)
        c = sign_in(ui, ui.token)
        token = csrf_of(c.get(f"/ui/jobs/{job}").text)
        url = f"/ui/jobs/{job}/cancel"
        assert c.post(url, data={}, headers={"origin": ui.url}).status_code == 403
        assert c.post(url, data={"csrf": "0" * 64}, headers={"origin": ui.url}).status_code == 403
        evil = {"origin": "http://evil.example"}
        assert c.post(url, data={"csrf": token}, headers=evil).status_code == 403
        site = {"sec-fetch-site": "cross-site"}
        assert c.post(url, data={"csrf": token}, headers=site).status_code == 403
        other = sign_in(ui, ui.token)  # another session's token is not this one's
        assert other.post(url, data={"csrf": token}, headers={"origin": ui.url}).status_code == 403
        assert ui.api("GET", f"/api/v1/jobs/{job}").json()["state"] == "queued"

    def test_an_operator_disables_and_enables_a_worker(self, ui):
        wait_for(
            lambda: any(w["attached"] for w in ui.api("GET", "/api/v1/workers").json()),
            30,
            "the built-in worker",
        )
        c = sign_in(ui, ui.token)
        page = c.get("/ui/workers").text
        name = re.search(r'data-worker="([^"]+)"', page).group(1)
        token = csrf_of(page)
        # (disable, not drain: a drained worker with nothing to do leaves, and stays offline)
        for verb, shown in (("disable", "disabled"), ("enable", "active")):
            r = c.post(
                f"/ui/workers/{name}/{verb}", data={"csrf": token}, headers={"origin": ui.url}
            )
            assert r.status_code == 303, r.text
            workers = ui.api("GET", "/api/v1/workers").json()
            assert next(w for w in workers if w["name"] == name)["state"] == shown
        actions = {(e["action"], e["target"]) for e in ui.api("GET", "/api/v1/audit").json()}
        assert {("worker.disabled", name), ("worker.enabled", name)} <= actions


ASKS = (
    "from berth_runtime import request_approval\n"
    "approved = request_approval('deploy v2', 'to prod')\n"
    "print('approved:', approved, flush=True)\n"
    "raise SystemExit(0 if approved else 3)\n"
)


class TestApprovals:
    def test_a_member_approves_and_the_creator_may_not(self, ui, tmp_path):
        """Four-eyes through the UI: the admin who submitted sees the request but no buttons and
        is refused if it posts anyway; another member of the tenant approves; the job goes on."""
        script = tmp_path / "asks.py"
        script.write_text(ASKS)
        r = ui.cli("job", "submit", "--python", str(script))
        assert r.code == 0, r.err
        job = int(r.out.split()[0])

        def asked() -> dict | None:
            found = ui.api("GET", "/api/v1/approvals", params={"job": job}).json()
            return found[0] if found else None

        request = wait_for(asked, 60, "the job to ask")
        admin = sign_in(ui, ui.token)
        page = admin.get("/ui/approvals").text
        assert f'data-approval="{request["id"]}"' in page and "deploy v2" in page
        assert 'data-answer="approve"' not in page and "four-eyes" in page
        token = csrf_of(admin.get(f"/ui/jobs/{job}").text)
        own = admin.post(
            f"/ui/approvals/{request['id']}/approve",
            data={"csrf": token},
            headers={"origin": ui.url},
        )
        assert own.status_code == 403 and "four-eyes" in own.text

        member = ui.cli("token", "create", "m2", "--kind", "service", "--tenant", "default")
        c = sign_in(ui, member.out.strip())
        page = c.get("/ui/approvals").text
        assert 'data-answer="approve"' in page
        answered = c.post(
            f"/ui/approvals/{request['id']}/approve",
            data={"csrf": csrf_of(page), "reason": "checked"},
            headers={"origin": ui.url},
        )
        assert answered.status_code == 303, answered.text
        shown = ui.api("GET", f"/api/v1/approvals/{request['id']}").json()
        assert (shown["state"], shown["answered_by"], shown["reason"]) == (
            "approved",
            "service:m2",
            "checked",
        )
        wait_for(
            lambda: ui.api("GET", f"/api/v1/jobs/{job}").json()["state"] == "succeeded",
            60,
            "the approved job to finish",
        )
        assert "No request waits" in c.get("/ui/approvals").text
