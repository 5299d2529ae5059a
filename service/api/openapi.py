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
from pathlib import Path
from typing import Any

from litestar import Request, Router
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

from service.config import Config

PATH = "/schema"
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


class _Served(OpenAPIRenderPlugin):
    """Renders the corrected document (see the module docstring)."""

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        return super().render(request, _patterns(copy.deepcopy(openapi_schema)))  # type: ignore[safe-super]


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
