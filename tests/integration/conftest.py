"""In-process API tests: the real Litestar app on a real, migrated Postgres (one per test).

No server process and no worker: routes, guards, bodies and queries, fast. The hub is built but
its loops do not run, so nothing is dispatched unless a test does it. The app runs on the
test's own event loop (httpx's ASGI transport), so it shares the database pool with the test.
"""

import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar import Litestar

from service.api.app import create_app
from service.api.assembly import assemble
from service.api.runtime import Runtime
from service.config import Config, load
from service.db.engine import Database
from service.domain import tokens

KEY = b"k" * 32
POOLS = {"pools": {"gpu": {"slots": {"default": 2}}}}


@dataclass
class Api:
    client: httpx.AsyncClient
    rt: Runtime
    admin: str
    app: Litestar  # what the client calls; a fake worker dials it too

    async def call(
        self, method: str, path: str, token: str | None = None, **kw: Any
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.admin}", **kw.pop("headers", {})}
        return await self.client.request(method, path, headers=headers, **kw)

    async def mint(self, name: str, kind: str, *tenants: str, token: str | None = None) -> str:
        body = {"name": name, "kind": kind, "tenants": list(tenants)}
        r = await self.call("POST", "/api/v1/tokens", token, json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


def rebuilt(api: Api, **changes: Any) -> Api:
    """The same server with some of its runtime's values changed (e.g. `cas=`): a new app on
    the same database, hub and admin, as `berth serve` would have built it from the start."""
    rt = dataclasses.replace(api.rt, **changes)
    app = create_app(rt)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://berth.test")
    return Api(client=client, rt=rt, admin=api.admin, app=app)


def config(extra: dict | None = None) -> Config:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTH_")}
    env["BERTH_CONFIG_JSON"] = json.dumps(extra or POOLS)
    return load(Path("/nonexistent/berth.toml"), environ=env)


@pytest.fixture
async def api(db_url: str) -> AsyncIterator[Api]:
    cfg = config()
    database = Database(db_url)
    rt = assemble(cfg, database, server_id="test", version="test", secret_key=KEY)
    admin = await tokens.ensure_admin(database)
    assert admin is not None
    app = create_app(rt)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://berth.test") as client:
        yield Api(client=client, rt=rt, admin=admin, app=app)
    await database.dispose()


@pytest.fixture
async def api_with(db_url: str) -> AsyncIterator[Callable[[dict[str, Any]], Awaitable[Api]]]:
    """Like `api`, on a config of the test's own (BERTH_CONFIG_JSON's shape): `await
    api_with({...})`. Apps made in one test share its database (as servers share one) and its
    admin token."""
    admins: list[str] = []
    async with contextlib.AsyncExitStack() as stack:

        async def make(extra: dict[str, Any]) -> Api:
            cfg = config(extra)
            database = Database(db_url)
            stack.push_async_callback(database.dispose)
            rt = assemble(
                cfg, database, server_id=f"test-{len(admins)}", version="test", secret_key=KEY
            )
            admin = await tokens.ensure_admin(database)
            admins.append(admin or admins[0])
            app = create_app(rt)
            transport = httpx.ASGITransport(app=app)
            client = await stack.enter_async_context(
                httpx.AsyncClient(transport=transport, base_url="http://berth.test")
            )
            return Api(client=client, rt=rt, admin=admins[-1], app=app)

        yield make
