"""A stand-in Kubernetes API server on 127.0.0.1, for the Kubernetes provider's tests.

It is a real HTTP server (stdlib, in a thread) implementing only what the provider calls, for
pods and secrets in a namespace: create (POST), get, list with `labelSelector`, delete. The
provider's client (kubernetes-asyncio) needs no discovery, so there is none; `/version` answers
for the curious. Like the API server, it:

- validates every body it receives against the JSON schema of one Kubernetes version
  (`VERSION`) with kubernetes-validate, strictly: an unknown field is an error. It answers
  422 Invalid with a Status whose message names the field. (A real API server answers a
  misspelled field with 400 BadRequest under `fieldValidation=Strict` and drops it otherwise;
  422 is what it gives a wrong value. The provider reports both the same way.)
- answers 201 with the object, completed with metadata.uid, resourceVersion,
  creationTimestamp and namespace (a Pod gets `status.phase: Pending`; a Secret's stringData
  is folded into base64 `data`); 409 AlreadyExists and 404 NotFound as Status objects; lists
  as `PodList`/`SecretList` with `metadata.resourceVersion` and `items`;
- on deleting a Pod, deletes the Secrets whose ownerReferences name its uid (the garbage
  collector, done at once here).

Tests read and change the state directly: `objects`, `set_pod_status` (validated too), `delete`
(as `kubectl delete` would), and `requests` (every request: method, path, query, body).
"""

import base64
import copy
import datetime as dt
import itertools
import json
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate

VERSION = "1.33"
KINDS = {"pods": "Pod", "secrets": "Secret"}
_PATH = re.compile(
    r"/api/v1/namespaces/(?P<ns>[^/]+)/(?P<plural>pods|secrets)(?:/(?P<name>[^/]+))?"
)
_TERM = re.compile(r"(?P<key>[A-Za-z0-9./_-]+)\s*(?P<op>==|!=|=)\s*(?P<value>[A-Za-z0-9._-]*)")


class Refused(Exception):
    """An API error: the status code and the Status object to answer with."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.body = status(code, reason, message, details)


def status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def validate(obj: dict[str, Any]) -> None:
    """Raise Refused(422) unless `obj` is valid, strictly, for Kubernetes `VERSION`."""
    name = (obj.get("metadata") or {}).get("name", "")
    kind = obj.get("kind", "")
    try:
        kubernetes_validate.validate(obj, VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = ".".join(str(p) for p in exc.path) or "<root>"
        raise Refused(
            422,
            "Invalid",
            f'{kind} "{name}" is invalid: {where}: {exc.message}',
            {
                "name": name,
                "kind": kind,
                "causes": [{"reason": "FieldValueInvalid", "message": exc.message, "field": where}],
            },
        ) from None
    except kubernetes_validate.SchemaNotFoundError as exc:
        raise Refused(400, "BadRequest", exc.message) from None


def selects(selector: str, labels: dict[str, str]) -> bool:
    """Equality-based label selectors: `k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-joined."""
    for raw in filter(None, (t.strip() for t in selector.split(","))):
        if raw.startswith("!"):
            if raw[1:].strip() in labels:
                return False
            continue
        if match := _TERM.fullmatch(raw):
            key, op, value = match["key"], match["op"], match["value"]
            if (labels.get(key) == value) != (op != "!="):
                return False
            continue
        if re.fullmatch(r"[A-Za-z0-9./_-]+", raw):
            if raw not in labels:
                return False
            continue
        raise Refused(400, "BadRequest", f"unable to parse requirement: {raw!r}")
    return True


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    authorization: str | None  # the Authorization header, to see which credential was sent


class Cluster:
    """The stored objects and the rules of the API; thread-safe."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._version = itertools.count(1)

    def store(self, ns: str, plural: str) -> dict[str, dict[str, Any]]:
        return self.objects.setdefault((ns, plural), {})

    def create(self, ns: str, plural: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise Refused(400, "BadRequest", "the body is not a JSON object")
        kind = KINDS[plural]
        if body.get("kind") != kind or body.get("apiVersion") != "v1":
            raise Refused(400, "BadRequest", f"expected v1 {kind}, got {body.get('kind')!r}")
        validate(body)
        meta = body.get("metadata") or {}
        name = meta.get("name")
        if not name:
            raise Refused(422, "Invalid", f"{kind} is invalid: metadata.name: Required value")
        if meta.get("namespace") not in {None, ns}:
            raise Refused(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on "
                "the request",
            )
        with self._lock:
            objects = self.store(ns, plural)
            if name in objects:
                raise Refused(
                    409,
                    "AlreadyExists",
                    f'{plural} "{name}" already exists',
                    {"name": name, "kind": plural},
                )
            obj = copy.deepcopy(body)
            obj["metadata"] = {
                **obj["metadata"],
                "namespace": ns,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(next(self._version)),
                "creationTimestamp": _now(),
            }
            if kind == "Pod":
                obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            if kind == "Secret" and "stringData" in obj:
                data = dict(obj.get("data") or {})
                for key, value in obj.pop("stringData").items():
                    data[key] = base64.b64encode(value.encode()).decode()
                obj["data"] = data
            objects[name] = obj
            return copy.deepcopy(obj)

    def get(self, ns: str, plural: str, name: str) -> dict[str, Any]:
        with self._lock:
            obj = self.store(ns, plural).get(name)
            if obj is None:
                raise _not_found(plural, name)
            return copy.deepcopy(obj)

    def list(self, ns: str, plural: str, selector: str) -> dict[str, Any]:
        with self._lock:
            items = [
                {k: v for k, v in copy.deepcopy(obj).items() if k not in {"kind", "apiVersion"}}
                for obj in self.store(ns, plural).values()
                if selects(selector, obj["metadata"].get("labels") or {})
            ]
            return {
                "kind": f"{KINDS[plural]}List",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(next(self._version))},
                "items": items,
            }

    def delete(self, ns: str, plural: str, name: str, grace: int | None = None) -> dict[str, Any]:
        with self._lock:
            obj = self.store(ns, plural).pop(name, None)
            if obj is None:
                raise _not_found(plural, name)
            uid = obj["metadata"]["uid"]
            if plural == "pods":
                secrets = self.store(ns, "secrets")
                for key, secret in list(secrets.items()):
                    owners = secret["metadata"].get("ownerReferences") or []
                    if any(o.get("uid") == uid for o in owners):
                        del secrets[key]
                obj["metadata"]["deletionTimestamp"] = _now()
                obj["metadata"]["deletionGracePeriodSeconds"] = 30 if grace is None else grace
                return obj
            return {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": name, "kind": plural, "uid": uid},
            }

    def set_pod_status(self, ns: str, name: str, pod_status: dict[str, Any]) -> None:
        """Replace a pod's status, as the kubelet would; the result must be a valid Pod."""
        with self._lock:
            pod = self.store(ns, "pods")[name]
            changed = {**copy.deepcopy(pod), "status": pod_status}
            changed["metadata"]["resourceVersion"] = str(next(self._version))
            validate(changed)
            self.store(ns, "pods")[name] = changed


def _not_found(plural: str, name: str) -> Refused:
    return Refused(404, "NotFound", f'{plural} "{name}" not found', {"name": name, "kind": plural})


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client expects
    cluster: Cluster  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def _answer(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            self._answer(400, status(400, "BadRequest", "the body is not JSON"))
            return
        self.cluster.requests.append(
            Request(self.command, url.path, query, body, self.headers.get("Authorization"))
        )
        try:
            self._answer(*self._route(url.path, query, body))
        except Refused as refused:
            self._answer(refused.code, refused.body)

    def _route(self, path: str, query: dict[str, str], body: Any) -> tuple[int, dict[str, Any]]:
        if path == "/version" and self.command == "GET":
            major, minor = VERSION.split(".")
            return 200, {"major": major, "minor": minor, "gitVersion": f"v{VERSION}.0"}
        match = _PATH.fullmatch(path)
        if match is None:
            raise Refused(404, "NotFound", "the server could not find the requested resource")
        ns, plural, name = match["ns"], match["plural"], match["name"]
        cluster = self.cluster
        if self.command == "POST" and name is None:
            return 201, cluster.create(ns, plural, body)
        if self.command == "GET" and name is None:
            return 200, cluster.list(ns, plural, query.get("labelSelector", ""))
        if self.command == "GET":
            return 200, cluster.get(ns, plural, name)
        if self.command == "DELETE" and name is not None:
            if body is not None:  # DeleteOptions; the client may send them as a body
                validate({**body, "apiVersion": "meta.k8s.io/v1", "kind": "DeleteOptions"})
            grace = query.get("gracePeriodSeconds")
            if grace is not None and not grace.isdigit():
                raise Refused(400, "BadRequest", f"invalid gracePeriodSeconds {grace!r}")
            return 200, cluster.delete(ns, plural, name, None if grace is None else int(grace))
        raise Refused(405, "MethodNotAllowed", f"{self.command} is not supported on {path}")

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _handle  # noqa: N815  (http.server's names)


@contextmanager
def running() -> Iterator[tuple[str, Cluster]]:
    """Serve a fresh Cluster on 127.0.0.1; yield its URL and the Cluster."""
    cluster = Cluster()
    handler = type("Handler", (_Handler,), {"cluster": cluster})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.02},  # how soon shutdown() is seen
        name="k8s-standin",
        daemon=True,
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", cluster
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
