"""Strict checks of deploy/envoy/envoy.yaml, without the envoy binary.

The file is parsed into Envoy's own protobuf messages (package xds-protos) with
`json_format.ParseDict`, which rejects unknown fields, wrong types, bad enums and unknown `@type`s;
Envoy loads YAML the same way (YAML -> JSON -> proto3 JSON parse). On top of that:

* cross-references Envoy only checks at load time (clusters, filter names, jwt requirements);
* the strip invariant: every header an auth filter stamps is removed from the client's request
  before any filter runs, so berth never sees a forged claim;
* the worker-header rule: `x-berth-worker` reaches berth only through routes that require the
  pinned workers JWT;
* a first-match route table that pins down which authentication chain each kind of request gets.

Each checker returns a list of error strings, and each has a test that breaks the config on
purpose and sees the error, so none of them passes vacuously. What this cannot replace is
`envoy --mode validate -c deploy/envoy/envoy.yaml` (extension registration, files, PGV rules).
"""

import copy
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.http.jwt_authn.v3 import (
    config_pb2 as jwt_authn_pb2,
)
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.http.early_header_mutation.header_mutation.v3 import (
    header_mutation_pb2 as early_mutation_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from google.protobuf import json_format
from google.protobuf.message import Message

REPO = Path(__file__).resolve().parents[2]
ENVOY_YAML = REPO / "deploy" / "envoy" / "envoy.yaml"
OAUTH2_PROXY_CFG = REPO / "deploy" / "oauth2-proxy" / "oauth2-proxy.cfg"
DEPLOY_README = REPO / "deploy" / "README.md"

# json_format resolves each "@type" through the default descriptor pool, which knows a message
# only once its *_pb2 module has been imported. Every type the file names is in this table, keyed
# by type URL, so an unlisted @type fails the strict parse instead of being skipped.
TYPED_CONFIGS: dict[str, type[Message]] = {
    cls.DESCRIPTOR.full_name: cls
    for cls in (
        hcm_pb2.HttpConnectionManager,
        ext_authz_pb2.ExtAuthz,
        ext_authz_pb2.ExtAuthzPerRoute,
        jwt_authn_pb2.JwtAuthentication,
        jwt_authn_pb2.PerRouteConfig,
        router_pb2.Router,
        early_mutation_pb2.HeaderMutation,
        tls_pb2.DownstreamTlsContext,
        tls_pb2.UpstreamTlsContext,
    )
}

EXT_AUTHZ = "envoy.filters.http.ext_authz"
JWT_AUTHN = "envoy.filters.http.jwt_authn"
ROUTER = "envoy.filters.http.router"
WORKER_HEADER = "x-berth-worker"
WORKERS_PROVIDER = "workers"
BERTH_CLUSTER = "berth"
OAUTH2_PROXY_CLUSTER = "oauth2_proxy"

# The chains a route can put a request through (see route_chain).
SSO = "sso"
NONE = "none"
WORKER_JWT = "jwt:worker"
SERVICE_JWT = "jwt:service"


def load_doc() -> dict[str, Any]:
    """The envoy.yaml document as plain data (anchors resolved), for mutation tests."""
    doc: dict[str, Any] = yaml.safe_load(ENVOY_YAML.read_text())
    return doc


def parse(doc: Mapping[str, Any]) -> Message:
    """Parse strictly into a Bootstrap; raises json_format.ParseError on any unknown field."""
    return json_format.ParseDict(doc, bootstrap_pb2.Bootstrap())


def unpack(any_msg: Message) -> Message:
    """The message inside a google.protobuf.Any, of the class its type URL names."""
    cls = TYPED_CONFIGS[any_msg.type_url.rsplit("/", 1)[-1]]
    msg = cls()
    if not any_msg.Unpack(msg):
        msg_name = f"cannot unpack {any_msg.type_url}"
        raise TypeError(msg_name)
    return msg


def typed_configs(msg: Message) -> Iterator[Message]:
    """Every message packed in a google.protobuf.Any anywhere inside `msg`, unpacked, nested too."""
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            is_message = field.message_type.fields_by_name["value"].message_type is not None
            items = list(value.values()) if is_message else []
        elif field.is_repeated:
            items = list(value)
        else:
            items = [value]
        for item in items:
            if item.DESCRIPTOR.full_name == "google.protobuf.Any":
                inner = unpack(item)
                yield inner
                yield from typed_configs(inner)
            else:
                yield from typed_configs(item)


@dataclass(frozen=True)
class View:
    """The parts of a parsed Bootstrap that the checks below look at."""

    bootstrap: Message
    hcm: Message
    early: Message  # the early HeaderMutation
    jwt: Message  # JwtAuthentication
    ext_authz: Message  # ExtAuthz
    filter_names: tuple[str, ...]
    routes: tuple[Message, ...]
    virtual_hosts: tuple[Message, ...]
    clusters: Mapping[str, Message]


def make_view(bootstrap: Message) -> View:
    """Locate the HCM, its filters and routes in the single listener."""
    (listener,) = bootstrap.static_resources.listeners
    (chain,) = listener.filter_chains
    (network_filter,) = chain.filters
    hcm = unpack(network_filter.typed_config)
    filters = {f.name: unpack(f.typed_config) for f in hcm.http_filters}
    (early_ext,) = hcm.early_header_mutation_extensions
    vhosts = tuple(hcm.route_config.virtual_hosts)
    return View(
        bootstrap=bootstrap,
        hcm=hcm,
        early=unpack(early_ext.typed_config),
        jwt=filters[JWT_AUTHN],
        ext_authz=filters[EXT_AUTHZ],
        filter_names=tuple(f.name for f in hcm.http_filters),
        routes=tuple(r for vh in vhosts for r in vh.routes),
        virtual_hosts=vhosts,
        clusters={c.name: c for c in bootstrap.static_resources.clusters},
    )


def view_of(doc: Mapping[str, Any]) -> View:
    """Parse and view a (possibly mutated) document."""
    return make_view(parse(doc))


def find_route(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """The route named `name` inside the plain document."""
    hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    for vhost in hcm["typed_config"]["route_config"]["virtual_hosts"]:
        for route in vhost["routes"]:
            if route.get("name") == name:
                route_doc: dict[str, Any] = route
                return route_doc
    raise KeyError(name)


def hcm_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """The HttpConnectionManager typed_config inside the plain document."""
    filters = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"]
    typed: dict[str, Any] = filters[0]["typed_config"]
    return typed


def http_filter_doc(doc: dict[str, Any], name: str) -> dict[str, Any]:
    """The typed_config of the HTTP filter `name` inside the plain document."""
    for http_filter in hcm_doc(doc)["http_filters"]:
        if http_filter["name"] == name:
            typed: dict[str, Any] = http_filter["typed_config"]
            return typed
    raise KeyError(name)


def http_early_mutations(doc: dict[str, Any]) -> list[Any]:
    """The early header mutation list inside the plain document (mutable)."""
    (extension,) = hcm_doc(doc)["early_header_mutation_extensions"]
    mutations: list[Any] = extension["typed_config"]["mutations"]
    return mutations


# --- matching, as Envoy does it -------------------------------------------------------------------


def string_matches(matcher: Message, value: str) -> bool:
    """Envoy StringMatcher semantics for the kinds this config uses."""
    kind = matcher.WhichOneof("match_pattern")
    fold: Callable[[str], str] = str.lower if matcher.ignore_case else str
    if kind == "exact":
        return fold(value) == fold(matcher.exact)
    if kind == "prefix":
        return fold(value).startswith(fold(matcher.prefix))
    if kind == "suffix":
        return fold(value).endswith(fold(matcher.suffix))
    if kind == "contains":
        return fold(matcher.contains) in fold(value)
    msg = f"StringMatcher kind {kind!r} is not modelled by this test"
    raise NotImplementedError(msg)


def header_matches(matcher: Message, headers: Mapping[str, str]) -> bool:
    """Envoy HeaderMatcher semantics for present_match and string_match."""
    if matcher.invert_match or matcher.treat_missing_header_as_empty:
        msg = f"header matcher flags on {matcher.name!r} are not modelled by this test"
        raise NotImplementedError(msg)
    value = headers.get(matcher.name.lower())
    kind = matcher.WhichOneof("header_match_specifier")
    if kind == "present_match":
        return (value is not None) is bool(matcher.present_match)
    if kind == "string_match":
        return value is not None and string_matches(matcher.string_match, value)
    msg = f"header matcher kind {kind!r} is not modelled by this test"
    raise NotImplementedError(msg)


def route_matches(route: Message, path: str, headers: Mapping[str, str]) -> bool:
    """Whether `route` matches a request (path without query string, lower-cased headers)."""
    match = route.match
    modelled = {"prefix", "path", "safe_regex", "headers"}
    extra = {field.name for field, _ in match.ListFields()} - modelled
    if extra:
        msg = f"route {route.name!r} uses unmodelled match fields {sorted(extra)}"
        raise NotImplementedError(msg)
    kind = match.WhichOneof("path_specifier")
    if kind == "prefix":
        path_ok = path.startswith(match.prefix)
    elif kind == "path":
        path_ok = path == match.path
    elif kind == "safe_regex":  # RE2 full match on the path; these regexes mean the same in re
        path_ok = re.fullmatch(match.safe_regex.regex, path) is not None
    else:
        msg = f"route {route.name!r}: path specifier {kind!r} is not modelled"
        raise NotImplementedError(msg)
    return path_ok and all(header_matches(h, headers) for h in match.headers)


def early_strip(view: View, headers: Mapping[str, str]) -> dict[str, str]:
    """The request headers left after the HCM's early header mutation."""
    kept = {name.lower(): value for name, value in headers.items()}
    for mutation in view.early.mutations:
        action = mutation.WhichOneof("action")
        if action == "remove":
            kept.pop(mutation.remove.lower(), None)
        elif action == "remove_on_match":
            matcher = mutation.remove_on_match.key_matcher
            kept = {k: v for k, v in kept.items() if not string_matches(matcher, k)}
        else:
            msg = f"early mutation action {action!r} is not modelled by this test"
            raise NotImplementedError(msg)
    return kept


def select_route(view: View, path: str, headers: Mapping[str, str]) -> Message:
    """The first route matching the request after the early strip, as Envoy picks it."""
    stripped = early_strip(view, headers)
    for route in view.routes:
        if route_matches(route, path, stripped):
            return route
    raise LookupError(path)


# --- what a route does ----------------------------------------------------------------------------


def route_chain(route: Message) -> str:
    """Which authentication a route applies: SSO, 'jwt:<requirement>', NONE, or 'both'."""
    per_filter = route.typed_per_filter_config
    ext_authz_on = True
    if EXT_AUTHZ in per_filter:
        ext_cfg = unpack(per_filter[EXT_AUTHZ])
        ext_authz_on = not (ext_cfg.WhichOneof("override") == "disabled" and ext_cfg.disabled)
    requirement = ""
    if JWT_AUTHN in per_filter:
        jwt_cfg = unpack(per_filter[JWT_AUTHN])
        if jwt_cfg.WhichOneof("requirement_specifier") == "requirement_name":
            requirement = jwt_cfg.requirement_name
    if ext_authz_on and requirement:
        return "both"
    if ext_authz_on:
        return SSO
    return f"jwt:{requirement}" if requirement else NONE


def requirement_providers(requirement: Message) -> set[str]:
    """Provider names a JwtRequirement accepts; '*unauthenticated*' if it lets requests through."""
    kind = requirement.WhichOneof("requires_type")
    if kind == "provider_name":
        return {requirement.provider_name}
    if kind == "provider_and_audiences":
        return {requirement.provider_and_audiences.provider_name}
    if kind in {"requires_any", "requires_all"}:
        group = getattr(requirement, kind).requirements
        return set().union(*(requirement_providers(r) for r in group))
    return {"*unauthenticated*"}  # allow_missing, allow_missing_or_failed, or unset


def stamped_headers(view: View) -> tuple[set[str], list[str]]:
    """Header names the auth filters put on the request to berth, and any that can't be named."""
    names: set[str] = set()
    errors: list[str] = []
    for provider in view.jwt.providers.values():
        names.update(c.header_name.lower() for c in provider.claim_to_headers)
        if provider.forward_payload_header:
            names.add(provider.forward_payload_header.lower())
    response = view.ext_authz.http_service.authorization_response
    for group in (response.allowed_upstream_headers, response.allowed_upstream_headers_to_append):
        for pattern in group.patterns:
            kind = pattern.WhichOneof("match_pattern")
            if kind == "exact":
                names.add(pattern.exact.lower())
            else:  # a prefix here could stamp names the strip check cannot enumerate
                errors.append(f"ext_authz upstream header patterns must be exact, got {kind}")
    return names, errors


# --- checkers: each returns a list of errors ------------------------------------------------------


def cross_reference_errors(view: View) -> list[str]:
    """References Envoy resolves only at load time: clusters, filter names, jwt requirements."""
    errors: list[str] = []
    for route in view.routes:
        if route.WhichOneof("action") != "route":
            errors.append(f"route {route.name!r} does not forward (redirect/direct response)")
        elif route.route.cluster not in view.clusters:
            errors.append(f"route {route.name!r} -> unknown cluster {route.route.cluster!r}")
        errors.extend(
            f"route {route.name!r}: typed_per_filter_config {key!r} names no http filter"
            for key in route.typed_per_filter_config
            if key not in view.filter_names
        )
        per_filter = route.typed_per_filter_config
        if JWT_AUTHN in per_filter:
            name = unpack(per_filter[JWT_AUTHN]).requirement_name
            if name and name not in view.jwt.requirement_map:
                errors.append(f"route {route.name!r}: requirement_name {name!r} not in map")
    for name, requirement in view.jwt.requirement_map.items():
        errors.extend(
            f"requirement {name!r} names unknown provider {provider!r}"
            for provider in sorted(requirement_providers(requirement))
            if provider not in view.jwt.providers
        )
    for provider_name, provider in view.jwt.providers.items():
        cluster = provider.remote_jwks.http_uri.cluster
        if cluster not in view.clusters:
            errors.append(f"provider {provider_name!r}: JWKS cluster {cluster!r} unknown")
    authz_cluster = view.ext_authz.http_service.server_uri.cluster
    if authz_cluster not in view.clusters:
        errors.append(f"ext_authz -> unknown cluster {authz_cluster!r}")
    if view.filter_names[-1:] != (ROUTER,):
        errors.append(f"{ROUTER} must be the last http filter, got {view.filter_names}")
    return errors


def strip_errors(view: View) -> list[str]:
    """The strip invariant: every stamped header is removed from the client's request first."""
    names, errors = stamped_headers(view)
    errors.extend(
        f"stamped header {name!r} is not stripped from client requests first"
        for name in sorted(names)
        if early_strip(view, {name: "forged", name.upper(): "forged"})
    )
    # Removing a claim header at route level would delete what ext_authz / jwt_authn just added
    # (the router runs last), and adding one there would be a forgery of Envoy's own making.
    edits = [("route_config", view.hcm.route_config)]
    edits += [(f"virtual host {vh.name!r}", vh) for vh in view.virtual_hosts]
    edits += [(f"route {r.name!r}", r) for r in view.routes]
    for where, holder in edits:
        removed = {h.lower() for h in holder.request_headers_to_remove}
        added = {h.header.key.lower() for h in holder.request_headers_to_add}
        errors.extend(
            f"{where} edits stamped header {name!r} at route level"
            for name in sorted((removed | added) & names)
        )
    return errors


def worker_header_errors(view: View) -> list[str]:
    """x-berth-worker reaches berth only on routes that require the pinned workers JWT."""
    errors: list[str] = []
    if not early_strip(view, {WORKER_HEADER: "w-1"}):
        errors.append(f"{WORKER_HEADER} is stripped early: workers could never name themselves")
    names, _ = stamped_headers(view)
    if WORKER_HEADER in names:
        errors.append(f"{WORKER_HEADER} is stamped by an auth filter, so route removal breaks")
    if any(string_matches(p, WORKER_HEADER) for p in view.ext_authz.allowed_headers.patterns):
        errors.append(f"{WORKER_HEADER} is forwarded to oauth2-proxy")
    workers = view.jwt.providers.get(WORKERS_PROVIDER)
    if workers is None or not workers.HasField("subjects"):
        errors.append(f"provider {WORKERS_PROVIDER!r} missing or its subject is not pinned")
    for route in view.routes:
        if WORKER_HEADER in {h.lower() for h in route.request_headers_to_remove}:
            continue
        chain = route_chain(route)
        requirement = view.jwt.requirement_map.get(chain.removeprefix("jwt:"))
        needs_workers_jwt = (
            chain.startswith("jwt:")
            and requirement is not None
            and requirement_providers(requirement) == {WORKERS_PROVIDER}
        )
        required = {
            h.name.lower()
            for h in route.match.headers
            if h.WhichOneof("header_match_specifier") == "present_match" and h.present_match
        }
        if not needs_workers_jwt or not {"authorization", WORKER_HEADER} <= required:
            errors.append(
                f"route {route.name!r} passes {WORKER_HEADER} without requiring the "
                f"{WORKERS_PROVIDER!r} provider ({chain})"
            )
    return errors


def route_chain_errors(view: View) -> list[str]:
    """Every route to berth authenticates exactly one way; unauthenticated ones avoid berth."""
    errors: list[str] = []
    for route in view.routes:
        chain = route_chain(route)
        requires_authorization = any(
            h.name.lower() == "authorization" and h.present_match for h in route.match.headers
        )
        if chain == "both":
            errors.append(f"route {route.name!r} enables both ext_authz and jwt_authn")
        elif chain == NONE and route.route.cluster == BERTH_CLUSTER:
            errors.append(f"route {route.name!r} reaches berth without authentication")
        elif chain.startswith("jwt:") and not requires_authorization:
            errors.append(f"route {route.name!r} uses jwt_authn but not only for Authorization")
    return errors


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def view() -> View:
    """The shipped envoy.yaml, parsed strictly."""
    return view_of(load_doc())


# --- tests ----------------------------------------------------------------------------------------


class TestStrictParse:
    """envoy.yaml is valid Envoy v3 config, and the parser used to say so is strict."""

    def test_parses_into_bootstrap(self) -> None:
        """The shipped file parses into envoy.config.bootstrap.v3.Bootstrap with no leftovers."""
        bootstrap = parse(load_doc())
        assert bootstrap.DESCRIPTOR.full_name == "envoy.config.bootstrap.v3.Bootstrap"
        assert bootstrap.static_resources.listeners

    def test_every_typed_config_is_a_listed_type(self, view: View) -> None:
        """Every @type in the file, nested ones too, is in TYPED_CONFIGS, and each entry is used."""
        used = {type(m).DESCRIPTOR.full_name for m in typed_configs(view.bootstrap)}
        assert used == set(TYPED_CONFIGS)

    def test_misspelled_route_field_is_rejected(self) -> None:
        """Renaming a route's `timeout` to `timout` makes the parse fail with ParseError."""
        doc = load_doc()
        action = find_route(doc, "oauth2")["route"]
        action["timout"] = action.pop("timeout")
        with pytest.raises(json_format.ParseError, match='no field named "timout"'):
            parse(doc)

    def test_misspelled_field_inside_typed_config_is_rejected(self) -> None:
        """A misspelled field inside an Any (ext_authz typed_config) fails the parse too."""
        doc = load_doc()
        response = http_filter_doc(doc, EXT_AUTHZ)["http_service"]["authorization_response"]
        response["allowed_upstream_header"] = response.pop("allowed_upstream_headers")
        with pytest.raises(json_format.ParseError, match="allowed_upstream_header"):
            parse(doc)

    def test_unknown_type_url_is_rejected(self) -> None:
        """A v2 @type that the v3 API no longer has fails the parse."""
        doc = load_doc()
        http_filter_doc(doc, ROUTER)["@type"] = (
            "type.googleapis.com/envoy.config.filter.http.router.v2.Router"
        )
        with pytest.raises(json_format.ParseError, match="Can not find message descriptor"):
            parse(doc)

    def test_duration_as_number_is_rejected(self) -> None:
        """A duration written as a bare number (60, not "60s") fails the parse."""
        doc = load_doc()
        find_route(doc, "oauth2")["route"]["timeout"] = 60
        with pytest.raises(json_format.ParseError, match="Duration"):
            parse(doc)


class TestCrossReferences:
    """Names that refer to other parts of the file all resolve."""

    def test_shipped_config_has_no_dangling_references(self, view: View) -> None:
        """Clusters, per-filter keys, requirement names and providers all exist."""
        assert cross_reference_errors(view) == []

    def test_route_to_unknown_cluster_is_reported(self) -> None:
        """A route naming a cluster that does not exist is reported."""
        doc = load_doc()
        find_route(doc, "oauth2")["route"]["cluster"] = "oauth2-proxy"
        assert "route 'oauth2' -> unknown cluster 'oauth2-proxy'" in cross_reference_errors(
            view_of(doc)
        )

    def test_per_filter_key_without_filter_is_reported(self) -> None:
        """A typed_per_filter_config key that names no http filter is reported."""
        doc = load_doc()
        route = find_route(doc, "browser-api")
        per_filter = dict(route["typed_per_filter_config"])  # a copy: the YAML anchor is shared
        per_filter["envoy.filters.http.jwt_authentication"] = per_filter.pop(JWT_AUTHN)
        route["typed_per_filter_config"] = per_filter
        errors = cross_reference_errors(view_of(doc))
        assert any("names no http filter" in e for e in errors)

    def test_unknown_requirement_name_is_reported(self) -> None:
        """A route's requirement_name missing from requirement_map is reported."""
        doc = load_doc()
        per_filter = copy.deepcopy(find_route(doc, "service-api")["typed_per_filter_config"])
        per_filter[JWT_AUTHN]["requirement_name"] = "services"
        find_route(doc, "service-api")["typed_per_filter_config"] = per_filter
        assert "route 'service-api': requirement_name 'services' not in map" in (
            cross_reference_errors(view_of(doc))
        )


class TestHeaderStripping:
    """No client-sent claim header survives to berth."""

    def test_every_stamped_header_is_stripped_early(self, view: View) -> None:
        """Each header ext_authz or jwt_authn stamps is removed before any filter runs."""
        assert strip_errors(view) == []

    def test_stamped_headers_are_the_claims_berth_reads(self, view: View) -> None:
        """The auth filters stamp exactly the oauth2-proxy and x-jwt-* claim headers."""
        names, errors = stamped_headers(view)
        assert errors == []
        assert names == {
            "x-auth-request-user",
            "x-auth-request-email",
            "x-auth-request-groups",
            "x-auth-request-preferred-username",
            "x-jwt-sub",
            "x-jwt-iss",
            "x-jwt-azp",
        }

    def test_dropping_the_jwt_prefix_rule_is_reported(self) -> None:
        """Without the x-jwt- strip rule, every x-jwt-* claim header is reported unstripped."""
        doc = load_doc()
        mutations = http_early_mutations(doc)
        mutations[:] = [m for m in mutations if "x-jwt-" not in str(m)]
        errors = strip_errors(view_of(doc))
        assert "stamped header 'x-jwt-sub' is not stripped from client requests first" in errors
        assert len(errors) == 3

    def test_route_level_removal_of_a_claim_is_reported(self) -> None:
        """Removing a claim header in a route (after ext_authz stamped it) is reported."""
        doc = load_doc()
        find_route(doc, "browser-api")["request_headers_to_remove"] = ["x-auth-request-user"]
        assert "route 'browser-api' edits stamped header 'x-auth-request-user' at route level" in (
            strip_errors(view_of(doc))
        )

    def test_forged_claims_in_any_spelling_are_removed(self, view: View) -> None:
        """Mixed-case and unlisted x-auth-request-*/x-jwt-* copies are all stripped."""
        forged = {
            "X-Auth-Request-User": "mallory",
            "X-AUTH-REQUEST-GROUPS": "berth-admins",
            "X-Auth-Request-Tenant": "ml",
            "x-JWT-sub": "berth-workers",
            "X-Forwarded-User": "mallory",
            "X-Forwarded-Host": "evil.example",
            "cookie": "__Host-berth_session=abc",
        }
        assert early_strip(view, forged) == {"cookie": "__Host-berth_session=abc"}

    def test_headers_with_underscores_are_refused(self, view: View) -> None:
        """X_Auth_Request_User cannot slip past the dash-only strip: such requests are refused."""
        options = view.hcm.common_http_protocol_options
        assert options.headers_with_underscores_action == type(options).REJECT_REQUEST


class TestWorkerHeader:
    """x-berth-worker reaches berth only from a caller holding the shared workers JWT."""

    def test_shipped_config_keeps_the_worker_header_to_worker_routes(self, view: View) -> None:
        """Every route either removes x-berth-worker or requires the pinned workers provider."""
        assert worker_header_errors(view) == []

    def test_route_that_forgets_to_remove_it_is_reported(self) -> None:
        """A browser route that does not remove x-berth-worker is reported."""
        doc = load_doc()
        del find_route(doc, "browser-api")["request_headers_to_remove"]
        assert worker_header_errors(view_of(doc)) == [
            (
                "route 'browser-api' passes x-berth-worker without requiring the 'workers' "
                "provider (sso)"
            )
        ]

    def test_stripping_it_early_is_reported(self) -> None:
        """Stripping x-berth-worker for everyone would lock workers out, and is reported."""
        doc = load_doc()
        http_early_mutations(doc).append({"remove": WORKER_HEADER})
        assert any("stripped early" in e for e in worker_header_errors(view_of(doc)))

    def test_workers_provider_pins_the_shared_subject(self, view: View) -> None:
        """Only the one shared worker identity passes the workers provider."""
        subjects = view.jwt.providers[WORKERS_PROVIDER].subjects
        assert subjects.WhichOneof("match_pattern") == "exact"
        assert subjects.exact == "berth-workers"


class RouteCase(NamedTuple):
    """A request, and what Envoy must do with it."""

    id: str
    path: str  # without the query string
    headers: dict[str, str]
    route: str  # the first route that matches
    chain: str
    worker_header_passes: bool  # x-berth-worker reaches berth


BEARER = "Bearer eyJhbGciOiJSUzI1NiJ9.e30.sig"
WS = {"upgrade": "websocket", "connection": "Upgrade"}
WORKER_AUTH = {"authorization": BEARER, WORKER_HEADER: "w-1"}
SERVICE_AUTH = {"authorization": BEARER}
CAS_PATH = "/api/v1/cas/" + "a" * 64
ROUTE_CASES = [
    RouteCase("browser page", "/api/v1/jobs", {"cookie": "s=1"}, "browser-api", SSO, False),
    RouteCase("browser log follow", "/api/v1/jobs/j1/logs", {}, "browser-stream", SSO, False),
    RouteCase("browser websocket", "/api/v1/jobs/j1/logs", WS, "browser-websocket", SSO, False),
    RouteCase(
        "browser posing as worker",
        "/api/v1/workers/attach",
        {**WS, WORKER_HEADER: "w-1", "X-Jwt-Sub": "berth-workers"},
        "browser-websocket",
        SSO,
        False,
    ),
    RouteCase(
        "worker attach",
        "/api/v1/workers/attach",
        {**WS, "Upgrade": "WebSocket", **WORKER_AUTH},
        "worker-websocket",
        WORKER_JWT,
        True,
    ),
    RouteCase("worker CAS get", CAS_PATH, WORKER_AUTH, "worker-stream", WORKER_JWT, True),
    RouteCase("worker API call", "/api/v1/jobs/j1", WORKER_AUTH, "worker-api", WORKER_JWT, True),
    RouteCase("service submit", "/api/v1/jobs", SERVICE_AUTH, "service-api", SERVICE_JWT, False),
    RouteCase(
        "service log follow",
        "/api/v1/jobs/j1/logs",
        SERVICE_AUTH,
        "service-stream",
        SERVICE_JWT,
        False,
    ),
    RouteCase(
        "service websocket",
        "/api/v1/jobs/j1/logs",
        {**WS, **SERVICE_AUTH},
        "service-websocket",
        SERVICE_JWT,
        False,
    ),
    RouteCase(
        "basic auth does not skip checks",
        "/api/v1/jobs",
        {"Authorization": "Basic YTpi"},
        "service-api",
        SERVICE_JWT,
        False,
    ),
    RouteCase("oauth2 callback", "/oauth2/callback", {}, "oauth2", NONE, False),
    RouteCase("oauth2-proxy ping", "/oauth2/ping", {WORKER_HEADER: "w-1"}, "oauth2", NONE, False),
    RouteCase("robots", "/robots.txt", {}, "robots", NONE, False),
]


class TestRouting:
    """Which chain each kind of request goes through (first match wins)."""

    @pytest.mark.parametrize("case", ROUTE_CASES, ids=[case.id for case in ROUTE_CASES])
    def test_request_takes_expected_route(self, view: View, case: RouteCase) -> None:
        """A request lands on the expected route and chain, and x-berth-worker passes or not."""
        route = select_route(view, case.path, case.headers)
        assert (route.name, route_chain(route)) == (case.route, case.chain)
        upstream = early_strip(view, case.headers)
        for name in route.request_headers_to_remove:
            upstream.pop(name.lower(), None)
        assert (WORKER_HEADER in upstream) is case.worker_header_passes

    def test_every_route_authenticates_exactly_one_way(self, view: View) -> None:
        """No route to berth is unauthenticated, doubly authenticated, or JWT without a header."""
        assert route_chain_errors(view) == []

    def test_route_that_disables_both_filters_is_reported(self) -> None:
        """A berth route with ext_authz and jwt_authn both disabled is reported."""
        doc = load_doc()
        find_route(doc, "browser-api")["typed_per_filter_config"] = find_route(doc, "oauth2")[
            "typed_per_filter_config"
        ]
        assert route_chain_errors(view_of(doc)) == [
            "route 'browser-api' reaches berth without authentication"
        ]

    def test_every_request_has_a_route(self, view: View) -> None:
        """The last route catches everything, through ext_authz."""
        last = view.routes[-1]
        assert last.match.prefix == "/"
        assert not last.match.headers
        assert route_chain(last) == SSO

    def test_long_lived_routes_have_no_request_timeout(self, view: View) -> None:
        """Websocket and streaming routes: timeout 0s (off) and a one-hour idle timeout."""
        long_lived = [
            r
            for r in view.routes
            if r.match.WhichOneof("path_specifier") == "safe_regex"
            or any(h.name == "upgrade" for h in r.match.headers)
        ]
        assert len(long_lived) == 6
        for route in long_lived:
            assert route.route.cluster == BERTH_CLUSTER
            assert route.route.timeout.ToSeconds() == 0, route.name
            assert route.route.idle_timeout.ToSeconds() == 3600, route.name

    def test_websocket_upgrades_are_enabled(self, view: View) -> None:
        """The HCM accepts websocket upgrades (and RFC 8441 over HTTP/2)."""
        assert [u.upgrade_type for u in view.hcm.upgrade_configs] == ["websocket"]
        assert view.hcm.http2_protocol_options.allow_connect is True

    def test_oauth2_proxy_pages_never_reach_berth(self, view: View) -> None:
        """Paths oauth2-proxy answers 200 without a session are routed to it, not authorised."""
        cfg = tomllib.loads(OAUTH2_PROXY_CFG.read_text())
        prefix = cfg.get("proxy_prefix", "/oauth2")
        unauthenticated_pages = [
            "/robots.txt",
            cfg.get("ping_path", "/ping"),
            cfg.get("ready_path", "/ready"),
            f"{prefix}/start",
            f"{prefix}/callback",
            f"{prefix}/sign_out",
        ]
        for path in unauthenticated_pages:
            route = select_route(view, path, {})
            assert (route.route.cluster, route_chain(route)) == (OAUTH2_PROXY_CLUSTER, NONE), path


class TestListenerClustersAndAuthServers:
    """The addresses and auth-server settings the deployment relies on."""

    def test_listener_is_tls_on_8443(self, view: View) -> None:
        """One listener on 0.0.0.0:8443 terminating TLS 1.2+ with h2 and http/1.1."""
        (listener,) = view.bootstrap.static_resources.listeners
        address = listener.address.socket_address
        # S104: the public listener is meant to bind every address.
        assert (address.address, address.port_value) == ("0.0.0.0", 8443)  # noqa: S104
        (chain,) = listener.filter_chains
        tls = unpack(chain.transport_socket.typed_config)
        assert isinstance(tls, tls_pb2.DownstreamTlsContext)
        assert list(tls.common_tls_context.alpn_protocols) == ["h2", "http/1.1"]
        params = tls.common_tls_context.tls_params
        assert params.tls_minimum_protocol_version == params.TLSv1_2

    @pytest.mark.parametrize(
        ("cluster", "port"), [(BERTH_CLUSTER, 8080), (OAUTH2_PROXY_CLUSTER, 4180)]
    )
    def test_local_upstreams_are_on_loopback(self, view: View, cluster: str, port: int) -> None:
        """berth and oauth2-proxy are reached on 127.0.0.1 only."""
        (locality,) = view.clusters[cluster].load_assignment.endpoints
        (endpoint,) = locality.lb_endpoints
        address = endpoint.endpoint.address.socket_address
        assert (address.address, address.port_value) == ("127.0.0.1", port)

    def test_ext_authz_asks_oauth2_proxy_at_the_original_path(self, view: View) -> None:
        """ext_authz calls oauth2-proxy with no path_prefix and fails closed."""
        service = view.ext_authz.http_service
        assert service.server_uri.uri == "http://127.0.0.1:4180"
        assert service.server_uri.cluster == OAUTH2_PROXY_CLUSTER
        assert service.path_prefix == ""
        assert view.ext_authz.failure_mode_allow is False
        allowed = {p.exact for p in view.ext_authz.allowed_headers.patterns}
        assert "cookie" in allowed

    def test_jwt_providers_strip_the_token_and_stamp_claims(self, view: View) -> None:
        """Both providers remove the verified JWT and stamp x-jwt-sub, -iss and -azp."""
        assert set(view.jwt.providers) == {"service_accounts", WORKERS_PROVIDER}
        assert view.jwt.bypass_cors_preflight is False
        for provider in view.jwt.providers.values():
            assert provider.forward is False
            assert [h.value_prefix for h in provider.from_headers] == ["Bearer "]
            assert {c.header_name: c.claim_name for c in provider.claim_to_headers} == {
                "x-jwt-iss": "iss",
                "x-jwt-sub": "sub",
                "x-jwt-azp": "azp",
            }


class TestBerthProxySectionMatchesEnvoy:
    """The berth.toml [network.proxy] example in deploy/README.md agrees with envoy.yaml."""

    @staticmethod
    def berth_toml() -> dict[str, Any]:
        """The ```toml block of deploy/README.md that holds [network.proxy]."""
        blocks = re.findall(r"```toml\n(.*?)```", DEPLOY_README.read_text(), flags=re.DOTALL)
        (block,) = [b for b in blocks if "[network.proxy]" in b]
        return tomllib.loads(block)

    def test_claim_headers_are_stamped_and_stripped(self, view: View) -> None:
        """Every claim header berth reads is stamped by an auth filter and stripped early."""
        claims = self.berth_toml()["network"]["proxy"]["claims"]
        stamped, _ = stamped_headers(view)
        for claim, header in claims.items():
            assert header in stamped, claim
            assert not early_strip(view, {header: "forged"}), claim

    def test_worker_header_and_listen_match(self, view: View) -> None:
        """berth's worker_header is the one envoy routes on; berth listens where envoy sends."""
        network = self.berth_toml()["network"]
        assert network["proxy"]["worker_header"] == WORKER_HEADER
        assert (network["auth"], network["tls"]) == ("proxy", "proxy")
        (locality,) = view.clusters[BERTH_CLUSTER].load_assignment.endpoints
        address = locality.lb_endpoints[0].endpoint.address.socket_address
        assert network["listen"] == f"{address.address}:{address.port_value}"

    def test_worker_rule_names_the_pinned_subject(self, view: View) -> None:
        """The worker rule matches the principal the workers provider pins."""
        proxy = self.berth_toml()["network"]["proxy"]
        worker_rules = [r for r in proxy["rules"] if r.get("caller") == "worker"]
        assert worker_rules
        assert proxy["claims"]["principal"] == "x-jwt-sub"
        pinned = view.jwt.providers[WORKERS_PROVIDER].subjects.exact
        assert all(r["when"] == {"principal": pinned} for r in worker_rules)

    def test_example_is_a_valid_berth_config(self, tmp_path: Path) -> None:
        """The example loads as berth's own config: every key is one berth knows."""
        from service import config

        path = tmp_path / "berth.toml"
        blocks = re.findall(r"```toml\n(.*?)```", DEPLOY_README.read_text(), flags=re.DOTALL)
        path.write_text(next(b for b in blocks if "[network.proxy]" in b))
        loaded = config.load(path, environ={})
        assert loaded.network.auth == "proxy"
        assert [r.caller for r in loaded.network.proxy.rules] == ["human", "service", "worker"]
