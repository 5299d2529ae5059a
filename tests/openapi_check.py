"""The served OpenAPI document as a checker: each answer's status must be one its operation
declares, and a JSON body must match the schema declared for that status.

tests/integration/conftest.py hooks it into every in-process client, so every API test there
is also a contract test: a handler that raises an undocumented status, or answers a shape its
schema does not allow, fails the test that made the call.
"""

import json
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from service.api import openapi


def served(app: Any) -> dict[str, Any]:
    """The document as /schema/openapi.json serves it."""
    return openapi.document(app)


# Served, and left out of the document by design: the document's own pages, the console's
# HTML (service/api/ui) and the Prometheus text at /metrics.
OUTSIDE = ("/schema", "/ui", "/metrics")


class Undeclared(AssertionError):
    """An answer its operation does not declare."""


@dataclass
class Contract:
    doc: dict[str, Any]
    _paths: list[tuple[re.Pattern[str], str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Literal segments win over parameters (as in the router): /workers/cas/{sha256}
        # before /workers/{name}/{action}.
        paths = sorted(self.doc["paths"], key=lambda p: -len(re.sub(r"\{[^}]+\}", "", p)))
        self._paths = [
            (re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(p)) + "$"), p)
            for p in paths
        ]

    def operation(self, method: str, path: str) -> tuple[str, dict[str, Any] | None] | None:
        """(template, operation) for a request; operation None: the path has no such method."""
        for pattern, template in self._paths:
            if pattern.match(path):
                return template, self.doc["paths"][template].get(method.lower())
        return None

    def check(
        self, method: str, path: str, status: int, headers: dict[str, str], body: bytes
    ) -> None:
        """Raise Undeclared unless the answer is one the document declares."""
        if path.startswith(OUTSIDE):
            return
        found = self.operation(method, path)
        if found is None:  # no such route: a 404 in the one error shape
            self._error_body(f"{method} {path}", status, body, expected=404)
            return
        template, op = found
        where = f"{method} {template}"
        if op is None:
            if status == 405 and "allow" not in headers:
                raise Undeclared(f"{where}: 405 without an Allow header")
            self._error_body(where, status, body, expected=405)
            return
        declared = op["responses"].get(str(status))
        if declared is None:
            raise Undeclared(
                f"{where} answered {status}; it declares {sorted(op['responses'])}: {body[:200]!r}"
            )
        media = headers.get("content-type", "").split(";")[0].strip()
        if media != "application/json" or not body or method == "HEAD":
            return
        content = declared.get("content") or {}
        if "application/json" not in content:
            raise Undeclared(f"{where} {status}: a JSON body where none is declared")
        schema = {**content["application/json"]["schema"], "components": self.doc["components"]}
        try:
            jsonschema.validate(json.loads(body), schema)
        except jsonschema.ValidationError as exc:
            raise Undeclared(f"{where} {status}: body does not match its schema: {exc}") from exc

    def _error_body(self, where: str, status: int, body: bytes, *, expected: int) -> None:
        if status != expected:
            raise Undeclared(f"{where}: {status} where only {expected} can be")
        error = {"$ref": "#/components/schemas/ErrorView", "components": self.doc["components"]}
        jsonschema.validate(json.loads(body), error)
