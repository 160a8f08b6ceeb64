"""The recording reverse proxy: ``create_app(cfg)`` builds the aiohttp app, ``run_proxy(cfg)`` serves it.

Modules: ``app`` (forwarding, errors, control endpoints), ``sse`` (event framing, stripping,
reassembly), ``recorder`` (queue, worker thread, spool), ``metrics`` (Prometheus /metrics),
``sessions`` (identity, classification, next-state linking).
"""

from clawproxy.proxy.app import create_app, run_proxy

__all__ = ["create_app", "run_proxy"]
