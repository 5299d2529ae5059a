"""Checks of deploy/oauth2-proxy/oauth2-proxy.cfg, without the oauth2-proxy binary.

oauth2-proxy reads the legacy config with viper's `UnmarshalExact`, so an unknown key stops it at
start-up; its values are decoded weakly ("true" becomes a bool). This checker is stricter on
types than oauth2-proxy: a value must already have the Go type's TOML shape. The valid keys and
their Go types are the `cfg:"..."` struct tags of oauth2-proxy v7.15.3, vendored in
tests/deploy/oauth2_proxy_options.tsv (provenance in its header). `oauth2-proxy --config FILE
--config-test` remains the final word wherever the binary exists.
"""

import difflib
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
OPTIONS_TSV = HERE / "oauth2_proxy_options.tsv"
OAUTH2_PROXY_CFG = HERE.parents[1] / "deploy" / "oauth2-proxy" / "oauth2-proxy.cfg"

# Go's time.ParseDuration syntax: "0", or one or more <decimal><unit> ("1h30m", "2.5s").
GO_DURATION = re.compile(r"0|[-+]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+")


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


# How each Go type must look in TOML. bool is a subclass of int in Python, so int excludes it.
TYPE_CHECKS: dict[str, Callable[[object], bool]] = {
    "bool": lambda value: isinstance(value, bool),
    "string": lambda value: isinstance(value, str),
    "[]string": _is_str_list,
    "int": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "time.Duration": lambda value: (
        isinstance(value, str) and GO_DURATION.fullmatch(value) is not None
    ),
}


def load_options(path: Path = OPTIONS_TSV) -> dict[str, str]:
    """Option name -> Go type, from the vendored TSV (lines starting with # are comments)."""
    options: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line or line.startswith("#"):
            continue
        name, go_type = line.split("\t")
        if name in options:
            msg = f"{path.name}:{number}: duplicate option {name!r}"
            raise ValueError(msg)
        options[name] = go_type
    return options


def config_errors(config: Mapping[str, Any], options: Mapping[str, str]) -> list[str]:
    """Every problem with a parsed legacy config: unknown keys (with a hint) and wrong types."""
    errors: list[str] = []
    for key, value in config.items():
        go_type = options.get(key)
        if go_type is None:
            close = difflib.get_close_matches(key, options, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            errors.append(f"unknown option {key!r}{hint}")
        elif not TYPE_CHECKS[go_type](value):
            errors.append(f"{key}: expected {go_type}, got {type(value).__name__} {value!r}")
    return errors


@pytest.fixture(scope="module")
def options() -> dict[str, str]:
    """The vendored oauth2-proxy option list."""
    return load_options()


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    """The shipped oauth2-proxy.cfg, parsed as TOML."""
    with OAUTH2_PROXY_CFG.open("rb") as f:
        return tomllib.load(f)


class TestOptionList:
    """The vendored option list is well-formed."""

    def test_every_line_has_a_known_go_type(self, options: dict[str, str]) -> None:
        """Each option's Go type is one the checker knows how to verify."""
        assert set(options.values()) <= set(TYPE_CHECKS)
        assert len(options) == 168

    def test_header_says_where_it_came_from(self) -> None:
        """The TSV's comment header names the oauth2-proxy release and the sources it was
        extracted from, and nothing outside the repository or upstream."""
        header = [line for line in OPTIONS_TSV.read_text().splitlines() if line.startswith("#")]
        assert any("v7.15.3" in line for line in header)
        assert any("pkg/apis/options" in line for line in header)
        assert not any("/work/" in line or "../" in line for line in header), header


class TestChecker:
    """config_errors finds unknown keys and wrong types, and only those."""

    def test_shipped_config_is_clean(self, config: dict[str, Any], options: dict[str, str]) -> None:
        """Every key of oauth2-proxy.cfg is a known option with a value of its Go type."""
        assert config_errors(config, options) == []

    @pytest.mark.parametrize(
        ("key", "expected"),
        [
            (
                "set_xauth_request",
                "unknown option 'set_xauth_request' (did you mean 'set_xauthrequest'?)",
            ),
            ("email_domain", "unknown option 'email_domain' (did you mean 'email_domains'?)"),
            ("frobnicate_everything", "unknown option 'frobnicate_everything'"),
        ],
    )
    def test_unknown_key_is_rejected(
        self, options: dict[str, str], key: str, expected: str
    ) -> None:
        """A misspelled or invented key is reported, with the closest real key when there is one."""
        assert config_errors({key: True}, options) == [expected]

    @pytest.mark.parametrize(
        ("key", "value", "go_type"),
        [
            ("cookie_secure", "true", "bool"),
            ("http_address", 4180, "string"),
            ("upstreams", "static://200", "[]string"),
            ("upstreams", [200], "[]string"),
            ("logging_max_size", True, "int"),
            ("logging_max_size", "100", "int"),
            ("cookie_expire", 3600, "time.Duration"),
            ("cookie_expire", "12 hours", "time.Duration"),
        ],
    )
    def test_value_of_wrong_type_is_rejected(
        self, options: dict[str, str], key: str, value: object, go_type: str
    ) -> None:
        """A value whose TOML type does not match the option's Go type is reported."""
        (error,) = config_errors({key: value}, options)
        assert error.startswith(f"{key}: expected {go_type}, got ")

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("cookie_secure", False),
            ("upstreams", []),
            ("logging_max_size", 100),
            ("cookie_expire", "0"),
            ("cookie_expire", "1h30m"),
            ("cookie_refresh", "2.5s"),
        ],
    )
    def test_value_of_right_type_is_accepted(
        self, options: dict[str, str], key: str, value: object
    ) -> None:
        """Values in the Go type's TOML shape, including Go duration strings, pass."""
        assert config_errors({key: value}, options) == []


class TestBerthContract:
    """The settings berth's Envoy front end depends on."""

    def test_answers_ext_authz_with_200_and_claim_headers(self, config: dict[str, Any]) -> None:
        """A static 200 upstream carries X-Auth-Request-* back to Envoy's ext_authz."""
        assert config["upstreams"] == ["static://200"]
        assert config["set_xauthrequest"] is True
        assert config["reverse_proxy"] is True
        assert config["provider"] == "oidc"

    def test_listens_on_loopback_and_trusts_only_envoy(self, config: dict[str, Any]) -> None:
        """oauth2-proxy is reachable on 127.0.0.1:4180 and trusts X-Forwarded-* from there only."""
        assert config["http_address"] == "127.0.0.1:4180"
        assert config["trusted_proxy_ips"] == ["127.0.0.1/32"]

    def test_api_clients_get_401_not_a_redirect(self, config: dict[str, Any]) -> None:
        """Requests under /api/ without a session are answered 401."""
        assert "^/api/" in config["api_routes"]
        assert config["skip_provider_button"] is True

    def test_nothing_skips_authentication(self, config: dict[str, Any]) -> None:
        """No option lets a request through ext_authz without a session."""
        for key in ("skip_auth_regex", "skip_auth_routes", "trusted_ips"):
            assert key not in config, key
        assert config.get("skip_auth_preflight", False) is False
        assert config.get("skip_jwt_bearer_tokens", False) is False

    def test_unauthenticated_pages_are_under_proxy_prefix(self, config: dict[str, Any]) -> None:
        """The ping and ready pages (200 without a session) are under /oauth2/, routed directly."""
        prefix = config["proxy_prefix"]
        assert prefix == "/oauth2"
        assert config["ping_path"].startswith(f"{prefix}/")
        assert config["ready_path"].startswith(f"{prefix}/")

    def test_no_tokens_reach_berth(self, config: dict[str, Any]) -> None:
        """oauth2-proxy passes no access token or Authorization header on."""
        for key in (
            "pass_access_token",
            "pass_authorization_header",
            "set_authorization_header",
            "pass_user_headers",
        ):
            assert config[key] is False, key

    def test_session_cookie_is_locked_down(self, config: dict[str, Any]) -> None:
        """The session cookie is __Host-, Secure, HttpOnly, and its secret is not inline."""
        assert config["cookie_name"].startswith("__Host-")
        assert config["cookie_secure"] is True
        assert config["cookie_httponly"] is True
        assert config["cookie_path"] == "/"
        assert "cookie_domains" not in config  # __Host- cookies may not carry a Domain
        assert "cookie_secret" not in config
        assert "client_secret" not in config
        assert config["cookie_secret_file"].startswith("/run/secrets/")
        assert config["client_secret_file"].startswith("/run/secrets/")
