"""The web UI in a real browser: Debian's chromium driven by Selenium through its chromedriver.

Nothing downloads a browser: the binaries are /usr/bin/chromium and /usr/bin/chromedriver
(scripts/test installs them) and Selenium Manager is kept offline. Behind nginx in proxy mode
(tests/proxy), an admin and a member of one tenant use every page; in token mode the login form
signs in and a forged form on another origin changes nothing. Each page is screenshotted at
1280x800 and 390x844 under the test's folder (`screenshots/`), and must not scroll sideways.
"""

import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_proxy_nginx import CONFIG, Front
from tests.procs import Server, free_port, wait_for
from tests.proxy.authstub import WORKER_SECRET
from tests.proxy.harness import ProxyFront

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SIZES = {"desktop": (1280, 800, False), "phone": (390, 844, True)}
ALICE = {"Cookie": "session=alice"}  # berth-admins: admin
BOB = {"Cookie": "session=bob"}  # team-ml: member of tenant ml


class Browser:
    """One headless chromium session; `shoot` saves a screenshot at each size and checks width."""

    def __init__(self, shots: Path) -> None:
        if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
            pytest.fail("chromium and chromium-driver are missing: scripts/test installs them")
        os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must not fetch anything
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run"):
            options.add_argument(arg)
        self.driver = webdriver.Chrome(
            options=options, service=Service(executable_path=str(CHROMEDRIVER))
        )
        self.shots = shots
        shots.mkdir(parents=True, exist_ok=True)
        self.size("desktop")

    def size(self, name: str) -> None:
        width, height, mobile = SIZES[name]
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile},
        )

    def get(self, url: str) -> None:
        self.driver.get(url)

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def text(self, css: str) -> str:
        return str(
            self.js(f"const e = document.querySelector({css!r}); return e ? e.innerText : ''")
        )

    def has(self, css: str) -> bool:
        return bool(self.js(f"return document.querySelector({css!r}) !== null"))

    def shoot(self, label: str) -> None:
        """Screenshots at both sizes; neither may scroll sideways."""
        for name in SIZES:
            self.size(name)
            wide = self.js(
                "return [document.documentElement.scrollWidth, window.innerWidth, "
                "document.body.scrollWidth]"
            )
            self.driver.save_screenshot(str(self.shots / f"{label}-{name}.png"))
            assert wide[0] <= wide[1] and wide[2] <= wide[1], (label, name, wide)
        self.size("desktop")

    def quit(self) -> None:
        self.driver.quit()


@pytest.fixture
def browser(tmp_path) -> Iterator[Browser]:
    b = Browser(tmp_path / "screenshots")
    yield b
    b.quit()


def call(front: ProxyFront, who: dict[str, str], method: str, path: str, **kw: Any) -> Any:
    r = httpx.request(method, front.url + path, headers=who, timeout=30, **kw)
    assert r.status_code < 300, (r.status_code, r.text)
    return r.json()


def sign_in_as(b: Browser, front: ProxyFront, cookie: dict[str, str]) -> None:
    """The auth stub's session cookie, set on nginx's origin as an SSO login would."""
    b.get(front.url + "/ui/static/berth.css")
    b.driver.delete_all_cookies()
    name, _, value = cookie["Cookie"].partition("=")
    b.driver.add_cookie({"name": name, "value": value, "path": "/"})


@pytest.fixture
def proxied(server_factory, worker_factory, tmp_path) -> Iterator[tuple[Server, ProxyFront]]:
    """berth in proxy mode behind nginx, with a gpu worker attached through nginx too."""
    server = server_factory(CONFIG, builtin_worker=False)
    front = ProxyFront(tmp_path / "nginx", f"127.0.0.1:{server.port}").start()
    via = Front(server, front.url)
    worker_factory(via, WORKER_SECRET, "gpu", "--name", "gpu-w1", name="gpu-w1")
    wait_for(
        lambda: any(
            w["name"] == "gpu-w1" and w["attached"]
            for w in call(front, ALICE, "GET", "/api/v1/workers")
        ),
        60,
        "gpu-w1 attached through nginx",
    )
    yield server, front
    front.stop()


class TestThroughTheProxy:
    def test_admin_and_member_use_every_page(self, proxied, browser):
        """Alice (admin) sees both tenants' jobs and drain buttons; Bob (member of ml) sees ml's
        only and no drain button; every page renders for both, at both sizes."""
        _, front = proxied
        ids = {
            tenant: call(
                front,
                ALICE,
                "POST",
                "/api/v1/jobs",
                json={
                    "command": ["sh", "-c", f"echo from-{tenant}"],
                    "tenant": tenant,
                },
            )["id"]
            for tenant in ("ml", "other")
        }
        for job in ids.values():
            wait_for(
                lambda j=job: (
                    call(front, ALICE, "GET", f"/api/v1/jobs/{j}")["state"] == "succeeded"
                ),
                60,
                "the jobs to finish",
            )
        b = browser
        sign_in_as(b, front, ALICE)
        b.get(front.url + "/ui/jobs")
        assert "human:alice" in b.text("#who")
        rows = b.js(
            "return [...document.querySelectorAll('#jobs tr[data-tenant]')]"
            ".map(r => r.dataset.tenant)"
        )
        assert sorted(set(rows)) == ["ml", "other"]
        b.shoot("admin-jobs")
        b.get(front.url + f"/ui/jobs/{ids['other']}")
        assert "from-other" in b.text("#output")
        b.shoot("admin-job")
        b.get(front.url + "/ui/workers")
        assert b.has("button[data-action='drain']")
        b.shoot("admin-workers")
        b.get(front.url + "/ui/pools")
        assert b.has("#pool-gpu")
        b.shoot("admin-pools")
        b.get(front.url + "/ui/audit")
        assert "job.submitted" in b.text("#entries")
        b.driver.find_element("id", "verify").click()
        wait_for(lambda: b.text("#verify-result").strip() != "", 30, "the audit verdict")
        assert "Intact" in b.text("#verify-result"), b.text("#verify-result")
        b.shoot("admin-audit")
        b.get(front.url + "/ui/approvals")
        assert "No request waits" in b.text("#empty")
        b.shoot("admin-approvals")

        sign_in_as(b, front, BOB)
        b.get(front.url + "/ui/jobs")
        assert "human:bob" in b.text("#who")
        rows = b.js(
            "return [...document.querySelectorAll('#jobs tr[data-tenant]')]"
            ".map(r => r.dataset.tenant)"
        )
        assert set(rows) == {"ml"}
        b.shoot("member-jobs")
        b.get(front.url + f"/ui/jobs/{ids['ml']}")
        assert "from-ml" in b.text("#output")
        b.shoot("member-job")
        b.get(front.url + f"/ui/jobs/{ids['other']}")
        assert "404" in b.text("h1")  # another tenant's job is as absent as no job
        b.get(front.url + "/ui/workers")
        assert not b.has("button[data-action='drain']")
        b.shoot("member-workers")
        b.get(front.url + "/ui/pools")
        assert b.has("#pool-gpu")
        b.shoot("member-pools")
        b.get(front.url + "/ui/approvals")
        assert "No request waits" in b.text("#empty")
        b.shoot("member-approvals")
        b.get(front.url + "/ui/audit")
        assert "403" in b.text("h1")  # the audit log is the admins'
        b.shoot("member-audit")
        assert not b.has("a[href='/ui/audit']")
        for page in ("jobs", "job", "workers", "pools", "audit", "approvals"):
            for who in ("admin", "member"):
                for size in SIZES:
                    assert (b.shots / f"{who}-{page}-{size}.png").stat().st_size > 0

    def test_a_running_jobs_output_appears_and_cancel_works(self, proxied, browser):
        """Output shows on the page while the job runs, without a reload; clicking cancel
        cancels it (checked through the API)."""
        _, front = proxied
        job = call(
            front,
            ALICE,
            "POST",
            "/api/v1/jobs",
            json={
                "command": [
                    "sh",
                    "-c",
                    "i=0; while [ $i -lt 3000 ]; do echo tick-$i; i=$((i+1)); sleep 0.1; done",
                ],
            },
        )["id"]
        b = browser
        sign_in_as(b, front, ALICE)
        wait_for(
            lambda: call(front, ALICE, "GET", f"/api/v1/jobs/{job}")["state"] == "running",
            60,
            "the job to run",
        )
        b.get(front.url + f"/ui/jobs/{job}")
        b.js("document.getElementById('output').dataset.marker = 'same-page'")
        first = b.text("#output")
        wait_for(
            lambda: len(b.text("#output")) > len(first) + 20 and "tick-" in b.text("#output"),
            60,
            "new output on the open page",
        )
        assert b.js("return document.getElementById('output').dataset.marker") == "same-page"
        b.shoot("running-job")
        # Behind the proxy the browser's SSO cookie goes with any request: a forged form from
        # another origin, or one without the page's CSRF token, is still refused.
        cancel = f"{front.url}/ui/jobs/{job}/cancel"
        csrf = b.js("return document.querySelector('#cancel-form input[name=csrf]').value")
        forged = [
            ({**ALICE, "Origin": "http://evil.example"}, {"csrf": csrf}),
            ({**ALICE, "Origin": front.url}, {"csrf": "0" * 64}),
            ({**ALICE, "Origin": front.url}, {}),
        ]
        for headers, form in forged:
            r = httpx.post(cancel, headers=headers, data=form, timeout=30)
            assert r.status_code == 403, (headers, form, r.status_code)
        assert call(front, ALICE, "GET", f"/api/v1/jobs/{job}")["state"] == "running"
        b.driver.find_element("id", "cancel").click()
        wait_for(
            lambda: call(front, ALICE, "GET", f"/api/v1/jobs/{job}")["state"] == "cancelled",
            60,
            "the job to be cancelled",
        )
        wait_for(lambda: "cancelled" in b.text("#state"), 30, "the page to show it")


class _Evil(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class TestTokenMode:
    def test_login_form_and_a_forged_cross_origin_post(self, server_factory, browser, tmp_path):
        """The login form signs in with a token; a page on another origin that posts a cancel
        form at berth changes nothing."""
        s = server_factory({"pools": {"gpu": {"slots": {"default": 1}}}})
        job = s.api("POST", "/api/v1/jobs", json={"command": ["true"], "pool": "gpu"}).json()["id"]
        b = browser
        b.get(s.url + "/ui/jobs")
        wait_for(lambda: b.has("#token"), 10, "the login form")
        b.shoot("login")
        b.driver.find_element("id", "token").send_keys(s.token)
        b.driver.find_element("id", "sign-in").click()
        wait_for(lambda: b.has("#jobs"), 20, "the jobs page after signing in")
        assert "human:admin" in b.text("#who")
        assert s.token not in b.driver.current_url
        assert b.js("return document.cookie") == ""  # HttpOnly: no script sees it

        site = tmp_path / "evil"
        site.mkdir()
        (site / "index.html").write_text(
            f'<form id="f" method="post" action="{s.url}/ui/jobs/{job}/cancel">'
            '<input name="csrf" value="guess"></form>'
            "<script>document.getElementById('f').submit()</script>"
        )
        port = free_port()
        evil = http.server.ThreadingHTTPServer(
            ("127.0.0.1", port), lambda *a: _Evil(*a, directory=str(site))
        )
        threading.Thread(target=evil.serve_forever, daemon=True).start()
        try:
            b.get(f"http://localhost:{port}/index.html")  # another origin than 127.0.0.1
            wait_for(lambda: "localhost" not in b.driver.current_url, 20, "the forged post")
        finally:
            evil.shutdown()
        assert s.api("GET", f"/api/v1/jobs/{job}").json()["state"] == "queued"
        b.get(s.url + f"/ui/jobs/{job}")
        b.driver.find_element("id", "cancel").click()  # the page's own form does cancel it
        wait_for(
            lambda: s.api("GET", f"/api/v1/jobs/{job}").json()["state"] == "cancelled",
            20,
            "the cancel from berth's own page",
        )
