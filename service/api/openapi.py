r"""The OpenAPI document at /schema/openapi.json, and the pages that show it, served offline.

/schema/swagger, /schema/redoc and /schema/scalar load their scripts and styles from
/schema/assets/, which this package ships (service/api/openapi_assets/, from the npm packages
swagger-ui-dist, redoc and @scalar/api-reference; their licences are beside them): no page
reaches a CDN, so the docs work on a network with no way out.

The document is Litestar's, built from the handlers' types, with its patterns rewritten as it
is served for ECMA-262, as JSON Schema wants (`^...$`, not Python's `\A...\Z`). Its security
schemes say how this server authenticates (`[network] auth`): a bearer token, or the headers
the proxy in front of it sets.
"""

import copy
import re
import typing
from pathlib import Path
from typing import Any

import msgspec
from litestar import Litestar, Request, Router
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import (
    JsonRenderPlugin,
    OpenAPIRenderPlugin,
    RedocRenderPlugin,
    ScalarRenderPlugin,
    SwaggerRenderPlugin,
)
from litestar.openapi.spec import Components, SecurityScheme
from litestar.static_files import create_static_files_router

from service import views
from service.config import Config

PATH = "/schema"
REF = "#/components/schemas/"
ASSETS_DIR = Path(__file__).parent / "openapi_assets"
ASSETS = f"{PATH}/assets"
FAVICON = f"<link rel='icon' type='image/png' href='{ASSETS}/swagger-ui/favicon-32x32.png'>"

DESCRIPTION = """\
berth runs jobs on workers spread over many machines. Every error answer is one JSON object,
`{"error": "...", "status": N, "field": "..."}`: `field` names the request field at fault when
there is one. Times are RFC 3339 in UTC. The worker websocket (/api/v1/workers/attach) is not
described here: it speaks service.protocol.
"""


def _patterns(node: Any) -> Any:  # noqa: ANN401  (any JSON)
    """The document with every Python regex anchor made an ECMA-262 one."""
    if isinstance(node, dict):
        return {
            k: (_ecma(v) if k == "pattern" and isinstance(v, str) else _patterns(v))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_patterns(v) for v in node]
    return node


def _ecma(pattern: str) -> str:
    # \A and \Z anchor at the very start and end in Python; ^ and $ do in ECMA-262 (no m flag).
    return re.sub(r"\\[AZ]", lambda m: "^" if m[0] == "\\A" else "$", pattern)


def handlers(app: Litestar) -> list[HTTPRouteHandler]:
    return [
        handler
        for route in app.routes
        for handler in getattr(route, "route_handlers", ())
        if isinstance(handler, HTTPRouteHandler)
    ]


def structs(app: Litestar) -> set[type[msgspec.Struct]]:
    """The Structs the app's handlers take as bodies or answer with."""
    found: set[type[msgspec.Struct]] = set()

    def walk(annotation: Any) -> None:  # noqa: ANN401  (any annotation)
        if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
            found.add(annotation)
        for arg in typing.get_args(annotation):
            walk(arg)

    for handler in handlers(app):
        if handler.parsed_data_field is not None:
            walk(handler.parsed_data_field.annotation)
        walk(handler.parsed_fn_signature.return_type.annotation)
    return found


def _bodies(app: Litestar, doc: dict[str, Any]) -> None:
    """Each JSON request body as msgspec has it (a list's own bounds: at most MAX_BATCH jobs)."""
    declared = {
        h.operation_id: h.parsed_data_field.annotation
        for h in handlers(app)
        if h.parsed_data_field is not None and isinstance(h.operation_id, str)
    }
    for item in doc.get("paths", {}).values():
        for op in item.values():
            if not isinstance(op, dict) or op.get("operationId") not in declared:
                continue
            annotation = declared[op["operationId"]]
            content = op.get("requestBody", {}).get("content", {})
            if "application/json" in content:
                (schema,), _ = msgspec.json.schema_components(
                    [annotation], ref_template=REF + "{name}"
                )
                content["application/json"]["schema"] = schema


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _list_queries(app: Litestar, doc: dict[str, Any]) -> None:
    """Each repeated query parameter (`?tenant=a&tenant=b`) with its items' bounds.

    As msgspec checks them: Litestar's schema says "a list of any strings".
    """
    lists: dict[tuple[str, str], Any] = {}
    for h in handlers(app):
        for name, field in h.parsed_fn_signature.parameters.items():
            given = typing.get_args(field.annotation) or (field.annotation,)
            arms = [a for a in given if a is not type(None)]
            if len(arms) == 1 and typing.get_origin(arms[0]) is list:
                lists[(str(h.operation_id), name)] = arms[0]
    for item in doc.get("paths", {}).values():
        for op in item.values():
            if not isinstance(op, dict):
                continue
            for param in op.get("parameters", []):
                annotation = lists.get((op.get("operationId", ""), param["name"]))
                if param.get("in") == "query" and annotation is not None:
                    schema = msgspec.json.schema(annotation)
                    if "description" in param.get("schema", {}):
                        schema["description"] = param["schema"]["description"]
                    param["schema"] = schema


def document(app: Litestar) -> dict[str, Any]:
    """The document as served: Litestar's paths, msgspec's own schema of every Struct.

    Litestar's schemas of Structs drop the bounds of items and keys (`list[Name]` is a list of
    any strings there); msgspec's keep every one the decoder checks, so they replace them.
    """
    doc = copy.deepcopy(app.openapi_schema.to_schema())
    every = structs(app) | {views.ErrorView}  # the error shape is declared, not returned
    _, exact = msgspec.json.schema_components(
        sorted(every, key=lambda t: t.__name__), ref_template=REF + "{name}"
    )
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update({name: s for name, s in exact.items() if name in schemas})
    for struct in every:  # rules over several fields, which a field's type cannot say
        if (extra := getattr(struct, "JSON_SCHEMA_EXTRA", None)) and struct.__name__ in schemas:
            _merge(schemas[struct.__name__], extra)
    _bodies(app, doc)
    _list_queries(app, doc)
    return typing.cast("dict[str, Any]", _patterns(doc))


class _Served(OpenAPIRenderPlugin):
    """Renders the document as served (see `document`), built once per app."""

    _document: dict[str, Any] | None = None

    def render(self, request: Request[Any, Any, Any], _: dict[str, Any]) -> bytes:
        if self._document is None:
            self._document = document(request.app)
        return super().render(request, self._document)  # type: ignore[safe-super]


class Json(_Served, JsonRenderPlugin):
    pass


class Swagger(_Served, SwaggerRenderPlugin):
    pass


class Redoc(_Served, RedocRenderPlugin):
    pass


class Scalar(_Served, ScalarRenderPlugin):
    pass


def security(config: Config) -> tuple[dict[str, SecurityScheme], list[dict[str, list[str]]]]:
    """The schemes this server accepts, and the requirement of every guarded operation."""
    proxy = config.network.proxy
    claims = ", ".join(f"`{header}` ({claim})" for claim, header in sorted(proxy.claims.items()))
    schemes = {
        "bearer": SecurityScheme(
            type="http",
            scheme="bearer",
            bearer_format="brt_… (a berth token)",
            description="`Authorization: Bearer brt_…`, a token made by `berth token create` "
            '(with [network] auth = "token", the default).',
        ),
        "proxy": SecurityScheme(
            type="apiKey",
            name=proxy.jwt_header if proxy.verify_jwt else next(iter(proxy.claims.values()), ""),
            security_scheme_in="header",
            description=(
                'With [network] auth = "proxy": the proxy in front of berth authenticates, and '
                + (
                    f"forwards its JWT in `{proxy.jwt_header}`, verified against {proxy.jwks_url}."
                    if proxy.verify_jwt
                    else f"sets the claim headers {claims}; a worker also names itself in "
                    f"`{proxy.worker_header}`."
                )
                + " berth's own tokens are refused there; berth's [network.proxy] rules map "
                "the claims to a caller."
            ),
        ),
    }
    used = "proxy" if config.network.auth == "proxy" else "bearer"
    return schemes, [{used: []}]


def config(cfg: Config, version: str) -> OpenAPIConfig:
    """The OpenAPI config of the app serving `cfg`: its document, pages and their assets."""
    schemes, required = security(cfg)
    assets = create_static_files_router(
        path="/assets", directories=[ASSETS_DIR], include_in_schema=False, opt={"public": True}
    )
    return OpenAPIConfig(
        title="berth",
        version=version,
        description=DESCRIPTION,
        path=PATH,
        components=Components(security_schemes=schemes),  # type: ignore[arg-type]
        security=required,
        use_handler_docstrings=True,
        create_examples=False,
        openapi_router=Router(PATH, route_handlers=[assets], include_in_schema=False),
        render_plugins=[
            Swagger(
                path="/swagger",
                js_url=f"{ASSETS}/swagger-ui/swagger-ui-bundle.js",
                css_url=f"{ASSETS}/swagger-ui/swagger-ui.css",
                standalone_preset_js_url=f"{ASSETS}/swagger-ui/swagger-ui-standalone-preset.js",
                favicon=FAVICON,
            ),
            Redoc(
                path="/redoc",
                js_url=f"{ASSETS}/redoc/redoc.standalone.js",
                google_fonts=False,
                favicon=FAVICON,
            ),
            Scalar(
                path="/scalar",
                js_url=f"{ASSETS}/scalar/standalone.js",
                css_url=f"{ASSETS}/scalar/style.css",
                favicon=FAVICON,
                # Scalar fetches its fonts from its own host unless told not to.
                options={"withDefaultFonts": False, "hideClientButton": True},
            ),
            Json(path="/openapi.json"),
        ],
    )
