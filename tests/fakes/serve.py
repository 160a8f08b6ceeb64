"""Serve an aiohttp app on a loopback port from a thread, for tests whose client code is sync
(EngineClient, the trainer) and would block an event loop shared with the server."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from aiohttp import web


@contextlib.contextmanager
def serve_in_thread(app: web.Application) -> Iterator[str]:
    """Yield the base URL (``http://127.0.0.1:<port>``) while ``app`` runs in its own loop."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    started = threading.Event()
    box: dict[str, object] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        box["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, name="fake-server", daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("fake server did not start")
    try:
        yield f"http://127.0.0.1:{box['port']}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

