"""The proxy's own endpoints: ``/clawproxy/health``, ``/clawproxy/stats`` and ``/metrics``, each
behind the guard the engine's control verbs use too (``clawproxy/edge.py``). The dashboard under
``/clawproxy/ui`` is ``ui/``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from yarl import URL

from clawproxy.config import Config
from clawproxy.edge import control_route
from clawproxy.proxy.addons import ProxyStats
from clawproxy.proxy.metrics import ProxyMetrics


class Control:
    """The handlers, over what the app holds (``recording``: the recorder's stats, once it runs)."""

    def __init__(self, cfg: Config, ready: Callable[[], bool] | None, stats: ProxyStats,
                 recording: Callable[[], dict[str, Any]], metrics: ProxyMetrics):
        self.cfg, self.ready, self.counters, self.recording, self.prometheus = cfg, ready, stats, recording, metrics

    async def health(self, request: web.Request) -> web.Response:
        rs = self.recording()
        problems = []
        if not rs["store_ok"]:
            problems.append(f"store unavailable: {rs['last_error']}")
        if rs["turns_lost"]:
            problems.append(f"{rs['turns_lost']} turn(s) lost: {rs['last_loss']}")
        if not rs["journal_ok"]:
            problems.append("crash journal unavailable")
        return _json({
            "status": "ok",
            "recording": "degraded" if problems else "ok",
            "problems": problems,
            "upstream": str(URL(self.cfg.proxy.upstream or "").with_user(None)),
            "upstream_ready": self.ready() if callable(self.ready) else None,
            "store_ok": rs["store_ok"],
            "turns_lost": rs["turns_lost"],
            "quarantined": rs["quarantined"],
            "spool_records": rs["spool_records"],
        })

    async def stats(self, request: web.Request) -> web.Response:
        s = self.counters
        return _json({
            "requests": s.requests, "chat_requests": s.chat_requests, "errors": s.errors,
            "aborted": s.aborted, "in_flight": s.in_flight,
            "uptime_s": round(time.time() - s.started_at, 3),
            **self.recording(),
        })

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus exposition; the store is read in a worker thread (clawproxy/proxy/metrics.py)."""
        body, content_type = await self.prometheus.render(request.headers.get("Accept"))
        return web.Response(body=body, headers={"Content-Type": content_type})


def setup(app: web.Application, control: Control) -> None:
    """Add the proxy's own routes to ``app``."""
    p = control.cfg.proxy

    def guarded(handler: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
        return control_route(handler, lambda r: p.control_token, "proxy.control_token",
                             hosts=lambda r: p.host_names)

    app.router.add_get("/clawproxy/health", guarded(control.health))
    app.router.add_get("/clawproxy/stats", guarded(control.stats))
    app.router.add_get("/metrics", guarded(control.metrics))


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj), content_type="application/json")
