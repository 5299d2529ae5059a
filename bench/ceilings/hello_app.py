"""Hello-world Litestar app: the HTTP ceiling that berth's API can at best approach.

One synchronous handler run on the event loop (``sync_to_thread=False``), no middleware, plain
text body: whatever a server does on top of this is framework and server cost, not ours.
Served as ``hello_app:app`` by ``hello_bench.py``.
"""

from __future__ import annotations

from litestar import Litestar, get


@get("/", sync_to_thread=False)
def hello() -> str:
    return "hello, world"


app = Litestar(route_handlers=[hello], debug=False)
