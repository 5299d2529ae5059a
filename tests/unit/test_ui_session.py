"""The UI's session cookie and CSRF token: sealed, bound, and refused when anything is off."""

import pytest

from service.api.ui import session
from service.core.errors import Forbidden

KEY = b"k" * 32


class TestCookie:
    def test_round_trip_and_the_token_is_not_in_the_cookie(self):
        cookie = session.seal(KEY, "brt_secret-token")
        assert "brt_secret-token" not in cookie
        assert session.opened(KEY, cookie) == "brt_secret-token"

    def test_altered_foreign_expired_or_garbage_cookies_open_to_nothing(self):
        cookie = session.seal(KEY, "brt_x")
        flipped = cookie[:-2] + ("A" if cookie[-2] != "A" else "B") + cookie[-1]
        assert session.opened(KEY, flipped) == ""
        assert session.opened(b"o" * 32, cookie) == ""
        assert session.opened(KEY, session.seal(KEY, "brt_x", now=0.0)) == ""
        for junk in ("", "!!!", "AAAA", "a" * 500):
            assert session.opened(KEY, junk) == ""


class TestCsrf:
    def test_bound_to_its_session(self):
        token = session.csrf_token(KEY, "session:one")
        session.check_csrf(KEY, "session:one", token)
        for bound, sent in (("session:two", token), ("session:one", ""), ("session:one", "0" * 64)):
            with pytest.raises(Forbidden):
                session.check_csrf(KEY, bound, sent)

    @pytest.mark.parametrize(
        "headers",
        [
            {"origin": "http://evil.example", "host": "berth:8080"},
            {"origin": "http://berth:9999", "host": "berth:8080"},
            {"origin": "null", "host": "berth:8080"},
            {"sec-fetch-site": "cross-site", "host": "berth:8080"},
            {"sec-fetch-site": "same-site", "host": "berth:8080"},
        ],
    )
    def test_writes_from_elsewhere_are_refused(self, headers):
        with pytest.raises(Forbidden):
            session.check_same_origin(headers)

    @pytest.mark.parametrize(
        "headers",
        [
            {"origin": "http://berth:8080", "host": "berth:8080", "sec-fetch-site": "same-origin"},
            {"origin": "https://berth:8080", "host": "berth:8080"},  # TLS ended by a proxy
            {"host": "berth:8080"},  # not a browser: no Origin to forge with
        ],
    )
    def test_writes_from_the_page_itself_pass(self, headers):
        session.check_same_origin(headers)
