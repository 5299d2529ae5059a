"""The job's side of its relay to the worker: one request per connection.

Wire format: a JSON line (the request, with the lease's secret), then for `save` exactly `size`
raw bytes; the answer is a JSON line, then for `load` exactly `size` raw bytes.
"""

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, BinaryIO

CHUNK = 1 << 20


class RelayError(Exception):
    """The worker refused (the lease ended, the tenant holds no such artifact, ...)."""


def _connect() -> socket.socket:
    path = os.environ.get("BERTH_RELAY", "")
    if not path:
        raise RelayError("not inside a berth job (BERTH_RELAY is not set)")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise RelayError(
            f"the worker's relay is not there ({exc}); the lease may have ended"
        ) from None
    return sock


def _send(sock: socket.socket, request: dict[str, Any]) -> None:
    request["secret"] = os.environ.get("BERTH_RELAY_SECRET", "")
    sock.sendall(json.dumps(request).encode() + b"\n")


def _answer(reader: BinaryIO) -> dict[str, Any]:
    try:
        line = reader.readline()
    except OSError as exc:
        raise RelayError(f"the worker closed the relay ({exc})") from None
    if not line.endswith(b"\n"):
        raise RelayError("the worker closed the relay")
    answer: dict[str, Any] = json.loads(line)
    if answer.get("error"):
        raise RelayError(str(answer["error"]))
    return answer


def call(request: dict[str, Any]) -> dict[str, Any]:
    """One request without a body; its answer."""
    with _connect() as sock, sock.makefile("rb") as reader:
        # The worker may stop reading a request too large: its answer says why.
        with contextlib.suppress(OSError):
            _send(sock, request)
        return _answer(reader)


def emit(**metrics: float) -> None:
    """Record numbers for this job (`loss=0.5`): the newest value of each name is kept."""
    values = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"emit({name}=...) takes a number, not {type(value).__name__}")
        values[name] = float(value)
    call({"op": "emit", "values": values})


def save_artifact(path: str | os.PathLike[str]) -> str:
    """Store a file for this job's tenant; returns its ref (the sha256 of its content)."""
    file = Path(path)
    size = file.stat().st_size
    with _connect() as sock, sock.makefile("rb") as reader, file.open("rb") as f:
        sent = 0
        try:
            _send(sock, {"op": "save", "size": size, "name": file.name})
            while sent < size and (chunk := f.read(min(CHUNK, size - sent))):
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError as exc:
            # The worker may refuse before it reads the body (a bound): its answer says why.
            _answer(reader)  # raises the worker's refusal, when it sent one
            raise RelayError(f"the worker stopped reading the artifact ({exc})") from None
        if sent != size:
            raise RelayError(f"{file} changed while it was sent")
        return str(_answer(reader)["ref"])


def load_artifact(ref: str, path: str | os.PathLike[str]) -> Path:
    """Fetch the artifact `ref` (one this job's tenant holds) into `path`; returns the path."""
    target = Path(path)
    with _connect() as sock, sock.makefile("rb") as reader:
        _send(sock, {"op": "load", "ref": ref})
        answer = _answer(reader)
        left = int(answer["size"])
        tmp = target.with_name(f".{target.name}.part")
        with tmp.open("wb") as f:
            while left > 0:
                chunk = reader.read(min(CHUNK, left))
                if not chunk:
                    raise RelayError("the relay closed before the artifact was whole")
                f.write(chunk)
                left -= len(chunk)
        tmp.replace(target)
    return target


APPROVAL_POLL_MAX = 2.0  # seconds between two looks at an open request, at most
TRANSIENT = frozenset({429, 502, 503, 504})  # answers to look again after


def api(method: str, path: str, body: Any = None) -> Any:  # noqa: ANN401  (the server's JSON)
    """A relayed API call's body; RelayError with the server's refusal."""
    return _body(call({"op": "api", "method": method, "path": path, "body": body}))


def _body(answer: dict[str, Any]) -> Any:  # noqa: ANN401
    status, data = int(answer["status"]), answer.get("body")
    if status >= 400:
        message = data.get("error") if isinstance(data, dict) else None
        raise RelayError(message or f"HTTP {status}")
    return data


def request_approval(title: str, details: str = "") -> bool:
    """Ask a person's yes and wait for it: True once approved, False when denied or timed out.

    Another member of the job's tenant answers (`berth approval approve|deny ID`); unanswered
    after the pool's `approval_timeout_seconds`, the server denies it. The job keeps its slot
    while it waits. RelayError when the lease ends first (the job was cancelled, its worker lost).
    """
    asked = api("POST", "/api/v1/approvals", {"title": title, "details": details})
    path = f"/api/v1/approvals/{int(asked['id'])}"
    delay = 0.2
    while asked["state"] == "pending":
        time.sleep(delay)
        delay = min(delay * 2, APPROVAL_POLL_MAX)
        answer = call({"op": "api", "method": "GET", "path": path, "body": None})
        if int(answer["status"]) in TRANSIENT:
            continue  # the server restarting, or busy: the request waits in its table
        asked = _body(answer)
    if asked["state"] == "closed":
        raise RelayError(f"approval request {asked['id']} was closed: {asked.get('reason', '')}")
    return bool(asked["approved"])
