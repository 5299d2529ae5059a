"""The API as a contract: the OpenAPI document is valid and complete, every handler declares a
view as what it returns, and the docs pages are served from the package's own assets.

The app is built, never connected to a database (nothing here runs a query); the statuses the
routes really answer are checked against this document by every in-process API test
(tests/integration/conftest.py, tests/openapi_check.py).
"""

import json
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from litestar import Response
from litestar.handlers import HTTPRouteHandler
from litestar.response import Stream
from openapi_spec_validator import validate

from service import views
from service.api import contract
from service.api.app import ROUTES, create_app
from service.api.assembly import assemble
from service.config import load
from service.db.engine import Database
from tests.openapi_check import Contract, Undeclared, served

GUARDED = {"400", "401", "403", "503"}
METHODS = {"get", "put", "post", "delete", "head", "patch"}


def app(auth: str = "token") -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    env["BERTH_CONFIG_JSON"] = json.dumps(
        {"pools": {"gpu": {"slots": {"default": 2}}}, "network": {"auth": auth}}
    )
    cfg = load(Path("/nonexistent/berth.toml"), environ=env)
    db = Database("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    return create_app(assemble(cfg, db, server_id="t", version="t"))


async def get(path: str, auth: str = "token", method: str = "GET") -> httpx.Response:
    transport = httpx.ASGITransport(app=app(auth))
    async with httpx.AsyncClient(transport=transport, base_url="http://berth.test") as client:
        return await client.request(method, path)


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return served(app())


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in METHODS
    ]


class TestDocument:
    async def test_the_served_document_validates(self):
        """/schema/openapi.json is a valid OpenAPI document (openapi-spec-validator)."""
        r = await get("/schema/openapi.json")
        assert r.status_code == 200
        validate(r.json())

    def test_every_route_is_an_operation_with_an_id(self, doc):
        """Every HTTP route is in the document, each with a unique operationId."""
        ops = operations(doc)
        # Websockets (the worker's: service.protocol; exec: docs/api.md) are not OpenAPI
        # operations, and the console's pages and /metrics are left out by design.
        http = [h for h in ROUTES if isinstance(h, HTTPRouteHandler)]
        kept = [h for h in http if h.include_in_schema is not False]
        paths = {re.sub(r"\{(\w+):\w+\}", r"{\1}", p) for h in kept for p in h.paths}
        assert paths == set(doc["paths"])
        assert not any(p == "/metrics" or p.startswith("/ui") for p in doc["paths"])
        assert len(kept) < len(http)  # the UI and /metrics are routes all the same
        ids = [op.get("operationId") for _, _, op in ops]
        assert None not in ids and len(ids) == len(set(ids))

    def test_every_body_names_a_schema(self, doc):
        """Each request body and each response with content names a schema."""
        missing = []
        for method, path, op in operations(doc):
            for media, content in op.get("requestBody", {}).get("content", {}).items():
                if not content.get("schema"):
                    missing.append((method, path, "request", media))
            for status, response in op["responses"].items():
                for media, content in (response.get("content") or {}).items():
                    if not content.get("schema"):
                        missing.append((method, path, status, media))
        assert missing == []

    def test_bodies_are_declared_where_handlers_take_one(self, doc):
        """POST and PUT operations declare their request body; GET, HEAD and DELETE take none."""
        for method, path, op in operations(doc):
            takes = method in {"POST", "PUT"} and not path.endswith("/cancel")
            takes = takes and not path.startswith("/api/v1/workers/{name}")
            assert ("requestBody" in op) == takes, (method, path)

    def test_every_error_is_the_one_shape(self, doc):
        """Every 4xx/5xx with a body is an ErrorView; every guarded operation has 400/401/403/503."""
        for method, path, op in operations(doc):
            statuses = set(op["responses"])
            if op.get("security") == []:
                assert path in {"/healthz", "/readyz"} and "400" in statuses
            else:
                assert statuses >= GUARDED, (method, path, statuses)
            for status, response in op["responses"].items():
                if int(status) >= 400 and response.get("content"):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorView"}, (path, status)

    def test_success_answers_name_a_view(self, doc):
        """A 2xx JSON answer is one of service.views' Structs (or a list of them)."""
        names = {
            name for name, v in vars(views).items() if isinstance(v, type) and v is not views.View
        }
        for method, path, op in operations(doc):
            for status, response in op["responses"].items():
                json_body = (response.get("content") or {}).get("application/json")
                if not status.startswith("2") or json_body is None:
                    continue
                refs = set(re.findall(r"#/components/schemas/(\w+)", json.dumps(json_body)))
                assert refs and refs <= names, (method, path, status, refs)

    def test_parameters_carry_their_bounds(self, doc):
        """Numbers in queries say their range; the job-spec body says its bounds."""
        limit = next(
            p for p in doc["paths"]["/api/v1/jobs"]["get"]["parameters"] if p["name"] == "limit"
        )
        assert limit["schema"]["minimum"] == 1 and limit["schema"]["maximum"] == 10000
        body = doc["components"]["schemas"]["JobBody"]["properties"]
        assert body["max_attempts"]["minimum"] == 1 and body["max_attempts"]["maximum"] == 100
        assert body["priority"]["maximum"] == 2**31 - 1
        # Bounds of items and of a whole batch, which Litestar's own schemas would drop.
        assert body["labels"]["items"]["maxLength"] == 256
        tenants = doc["components"]["schemas"]["TokenBody"]["properties"]["tenants"]["items"]
        assert tenants["minLength"] == 1 and tenants["pattern"].startswith("^")
        batch = json.dumps(doc["paths"]["/api/v1/jobs"]["post"]["requestBody"])
        assert '"maxItems": 5000' in batch

    def test_patterns_are_ecma(self, doc):
        """No Python-only anchor (\\A, \\Z) is left in a pattern: JSON Schema regexes are ECMA."""
        patterns = re.findall(r'"pattern": "((?:[^"\\]|\\.)*)"', json.dumps(doc))
        assert patterns and not [p for p in patterns if "\\\\A" in p or "\\\\Z" in p]

    @pytest.mark.parametrize(("auth", "scheme"), [("token", "bearer"), ("proxy", "proxy")])
    def test_security_schemes_say_how_this_server_authenticates(self, auth, scheme):
        """The bearer token and the proxy's headers are both described; the one in use is required."""
        d = served(app(auth))
        assert set(d["components"]["securitySchemes"]) == {"bearer", "proxy"}
        assert d["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        assert "x-auth-request-user" in d["components"]["securitySchemes"]["proxy"]["description"]
        assert d["security"] == [{scheme: []}]
        assert d["paths"]["/healthz"]["get"]["security"] == []


# -- handlers --------------------------------------------------------------------------------


def arms(annotation: Any) -> list[Any]:
    """The types a handler may answer with: unions split, Response[X] and list[X] unwrapped."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in arms(arg)]
    if origin is typing.Annotated:
        return arms(typing.get_args(annotation)[0])
    if origin in (list, Response):
        return arms(typing.get_args(annotation)[0])
    return [annotation]


def allowed(handler: Any, arm: Any) -> bool:
    if isinstance(arm, type) and issubclass(arm, views.View):
        return True
    if arm in (None, types.NoneType, str):  # HEAD (no body), the store's id (text)
        return True
    # A streamed body whose operation says what it is (NDJSON lines, events, a blob's bytes).
    streamed = {contract.LogsOperation, contract.EventsOperation, contract.BlobReadOperation}
    return (arm is Stream or arm is Any) and handler.operation_class in streamed


class TestHandlers:
    def test_every_handler_returns_a_view(self):
        """A handler answering anything but a service.views Struct (say, dict[str, Any]) fails.

        Every API operation: not the websockets, nor the console's HTML pages and /metrics'
        text, which the document leaves out by design.
        """
        api = [h for h in ROUTES if isinstance(h, HTTPRouteHandler) and h.include_in_schema]
        assert any(h.handler_name == "submit" for h in api)
        wrong = [
            (h.handler_name, arm)
            for h in api
            for arm in arms(typing.get_type_hints(h.fn, include_extras=True)["return"])
            if not allowed(h, arm)
        ]
        assert wrong == []

    def test_the_check_would_catch_a_dict(self):
        """The walk above refuses `-> dict[str, Any]`, so it cannot pass vacuously."""

        class Fake:
            operation_class = contract.Operation

        assert not all(allowed(Fake(), a) for a in arms(dict[str, Any] | views.JobView))
        assert all(allowed(Fake(), a) for a in arms(list[views.JobView] | views.JobIdsView))

    def test_views_decode_their_own_json(self):
        """The CLI and a client decode answers by type: each view round-trips through JSON."""
        err = views.ErrorView(error="bad", status=400, field="priority")
        assert msgspec.json.decode(msgspec.json.encode(err), type=views.ErrorView) == err
        assert msgspec.json.encode(views.ErrorView(error="x", status=404)) == (
            b'{"error":"x","status":404}'
        )


class TestContractCheck:
    def test_an_undeclared_status_fails(self, doc):
        """The integration tests' checker refuses a status the operation does not declare."""
        check = Contract(doc)
        body = b'{"error": "x", "status": 418}'
        with pytest.raises(Undeclared, match="418"):
            check.check("GET", "/api/v1/jobs", 418, {"content-type": "application/json"}, body)
        check.check("GET", "/api/v1/jobs", 401, {"content-type": "application/json"}, body)

    def test_a_body_off_its_schema_fails(self, doc):
        """A 2xx body missing a declared field fails, as an error body not in the one shape."""
        check = Contract(doc)
        json_ = {"content-type": "application/json"}
        with pytest.raises(Undeclared, match="schema"):
            check.check("GET", "/api/v1/status", 200, json_, b'{"pools": {}}')
        with pytest.raises(Undeclared, match="schema"):
            check.check("GET", "/api/v1/jobs", 400, json_, b'{"detail": "x"}')

    def test_literal_paths_win_over_parameters(self, doc):
        """/api/v1/workers/cas/X is the store's route, not a worker's action."""
        found = Contract(doc).operation("GET", "/api/v1/workers/cas/" + "a" * 64)
        assert found is not None and found[0] == "/api/v1/workers/cas/{sha256}"


class TestServed:
    async def test_405_names_the_allowed_methods(self):
        """A method the route does not have is a 405 in the one error shape, with Allow."""
        r = await get("/api/v1/tokens", method="PATCH")
        assert r.status_code == 405
        assert {"GET", "POST"} <= {m.strip() for m in r.headers["allow"].split(",")}
        assert r.json() == {"error": "Method Not Allowed", "status": 405}

    @pytest.mark.parametrize(
        "page", ["/schema", "/schema/swagger", "/schema/redoc", "/schema/scalar"]
    )
    async def test_doc_pages_load_only_their_own_assets(self, page):
        """The docs pages reference no other host, and every asset they load is served."""
        r = await get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)""", r.text)
        assert urls, r.text[:500]
        assert [u for u in urls if "//" in u or not u.startswith("/schema/")] == []
        assert "cdn" not in r.text.lower() and "fonts.googleapis" not in r.text
        for url in urls:
            asset = await get(url)
            assert asset.status_code == 200 and len(asset.content) > 500, url

    def test_assets_are_in_the_package(self):
        """The assets live inside service/ (the wheel ships the package's files)."""
        root = Path(__file__).resolve().parents[2] / "service" / "api" / "openapi_assets"
        for name in (
            "swagger-ui/swagger-ui-bundle.js",
            "swagger-ui/swagger-ui.css",
            "redoc/redoc.standalone.js",
            "scalar/standalone.js",
        ):
            assert (root / name).stat().st_size > 10_000, name
