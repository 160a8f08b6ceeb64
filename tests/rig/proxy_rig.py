"""The proxy rig: a real fake upstream and the real proxy on loopback, and a real client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from clawproxy.config import Config, load_config
from clawproxy.proxy import create_app
from clawproxy.proxy.app import server_options
from clawproxy.store import Store
from tests.rig.fake_upstream import FakeUpstream
from tests.waits import until


class ProxyRig:
    """Fake upstream + proxy + client session, with helpers to wait for the recorder."""

    def __init__(self, fake: FakeUpstream, upstream_url: str, proxy_url: str, cfg: Config,
                 client: aiohttp.ClientSession, app: Any):
        self.fake, self.upstream_url, self.url, self.cfg = fake, upstream_url, proxy_url, cfg
        self.client, self.app = client, app

    async def stats(self) -> dict[str, Any]:
        async with self.client.get(self.url + "/clawproxy/stats") as r:
            return await r.json()

    async def stats_when(self, ready: Callable[[dict[str, Any]], bool], what: str,
                         timeout: float = 10.0) -> dict[str, Any]:
        """The proxy's stats once ``ready`` holds for them; fails naming ``what`` after ``timeout`` s."""
        async def check() -> dict[str, Any] | None:
            s = await self.stats()
            return s if ready(s) else None

        # each check is a request the proxy under test serves: not every 5 ms
        return await until(check, what, timeout, poll=0.02)

    async def wait_recorded(self, n: int, timeout: float = 10.0) -> None:
        """Until the recorder has written ``n`` turns in total (and its queue is empty)."""
        # a turn is counted once its transaction committed
        await self.stats_when(lambda s: s["turns_recorded"] >= n and s["queue_depth"] == 0,
                              f"the recorder to write {n} turns", timeout)

    def store(self) -> Store:
        return Store(self.cfg.db_path)

    def turns(self) -> list[dict[str, Any]]:
        s = self.store()
        try:
            return s.query("SELECT * FROM turns ORDER BY id")
        finally:
            s.close()

    async def chat(self, body: dict[str, Any], headers: dict[str, str] | None = None,
                   ) -> tuple[int, dict[str, str], bytes]:
        async with self.client.post(self.url + "/v1/chat/completions", json=body,
                                    headers=headers or {}) as r:
            return r.status, dict(r.headers), await r.read()


@pytest.fixture
async def make_rig(aiohttp_server, tmp_path) -> Callable[..., Any]:
    """``await make_rig(**config_overrides)`` -> ProxyRig. upstream_ready may be passed."""
    clients: list[aiohttp.ClientSession] = []
    runners: list[web.AppRunner] = []

    async def factory(upstream_ready: Callable[[], bool] | None = None, upstream: str | None = None,
                      **overrides: Any) -> ProxyRig:
        fake = FakeUpstream()
        up = await aiohttp_server(fake.app())
        up_url = upstream or str(up.make_url("")).rstrip("/")
        cfg = load_config(None, {"data_dir": str(tmp_path / "data"), "proxy.upstream": up_url,
                                 "proxy.extra_routes": ["/v1/echo/*"], **overrides})
        app = create_app(cfg, upstream_ready=upstream_ready)
        # Served as `clawproxy start` serves it (aiohttp's TestServer would add options of its own).
        runner = web.AppRunner(app, **server_options(cfg))
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        client = aiohttp.ClientSession()
        clients.append(client)
        return ProxyRig(fake, up_url, f"http://{host}:{port}", cfg, client, app)

    yield factory
    for c in clients:
        await c.close()
    for r in runners:
        await r.cleanup()


@pytest.fixture
async def rig(make_rig) -> ProxyRig:
    return await make_rig()
