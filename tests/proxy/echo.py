"""An upstream that echoes the raw request headers it received, over HTTP and over a websocket.

Plain `GET /anything` answers a JSON list of [name, value] pairs exactly as they arrived (so a
duplicate shows twice). A websocket upgrade sends that list as its first message and then echoes
each frame back. It stands where berth would, to check what nginx lets through.
"""

import json
import threading

from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.sync.server import Server, ServerConnection, serve


def _pairs(headers: Headers) -> str:
    return json.dumps([[k.lower(), v] for k, v in headers.raw_items()])


def _plain(connection: ServerConnection, request: Request) -> Response | None:
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return None
    response = connection.respond(200, _pairs(request.headers))
    response.headers["Content-Type"] = "application/json"
    return response


def _socket(connection: ServerConnection) -> None:
    assert connection.request is not None
    connection.send(_pairs(connection.request.headers))
    for message in connection:
        connection.send(message)


class Echo:
    """The echo upstream on a free loopback port, served from a daemon thread."""

    def __init__(self) -> None:
        self.server: Server = serve(_socket, "127.0.0.1", 0, process_request=_plain)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        host, port = self.server.socket.getsockname()[:2]
        return f"{host}:{port}"

    def start(self) -> "Echo":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)
