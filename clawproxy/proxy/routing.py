"""Model routing for a vLLM that serves the trained LoRA adapter: the user's model id stays stable.

vLLM answers 404 for an adapter's name until the adapter is loaded (``_check_model`` in
``vllm/entrypoints/serve/engine/serving.py``: "The model `clawproxy` does not exist"), and forgets
runtime adapters when it restarts. So OpenClaw names the base model (vLLM's served name), and the
proxy sends each chat request to the newest published adapter, or to the base model before there
is one. When vLLM answers that the adapter does not exist (it restarted), the proxy loads the
adapter again and retries the request once; if that fails the request goes to the base model.

Active only for ``engine.kind: vllm`` with ``trainer.finetune: lora``; the store's ``checkpoints``
table says what is published (polled every ``POLL_S``, off the request path).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web

from clawproxy.config import Config
from clawproxy.errors import ClawproxyError

log = logging.getLogger("clawproxy.proxy.routing")

POLL_S = 1.0
ADAPTER_NAME = "clawproxy"  # EngineClient's default lora_name: what the trainer loads


class ModelRouter:
    """Chooses the upstream model of each chat request (see the module docstring)."""

    def __init__(self, cfg: Config, adapter: str = ADAPTER_NAME):
        self.cfg = cfg
        self.base = cfg.engine.served_name
        self.adapter = adapter
        self.adapter_path: str | None = None  # newest published adapter; None: serve the base
        self._lock = asyncio.Lock()
        self._store: Any = None

    def target(self) -> str:
        return self.adapter if self.adapter_path else self.base

    def route(self, obj: dict[str, Any], body: bytes) -> bytes:
        """``body`` with its model set to the current target, when it names ours (or none)."""
        requested = obj.get("model")
        target = self.target()
        if requested not in (None, self.base, self.adapter) or requested == target:
            return body
        return orjson.dumps({**obj, "model": target})

    def lost(self, status: int, data: bytes) -> bool:
        """vLLM's 404 for our adapter's name: it restarted and lost the adapter."""
        return (status == 404 and self.adapter_path is not None and b"does not exist" in data
                and f"`{self.adapter}`".encode() in data)

    async def recover(self, body: bytes) -> bytes:
        """Load the adapter again (one request does it, the others wait for it); return ``body``
        routed to the adapter, or to the base model if the load failed."""
        path = self.adapter_path
        async with self._lock:
            if path is not None and path == self.adapter_path:
                try:
                    await asyncio.to_thread(self._client().load_adapter, path)
                    log.info("vLLM had lost adapter %r; loaded %s again", self.adapter, path)
                except ClawproxyError as e:
                    log.warning("could not load adapter %s again (%s); serving the base model "
                                "until the next publish", path, e.message)
                    self.adapter_path = None
        return self.route(orjson.loads(body), body)

    def _client(self) -> Any:
        from clawproxy.engine.client import EngineClient

        return EngineClient(self.cfg.proxy.upstream, kind="vllm", token=self.cfg.engine.control_token)

    def refresh(self) -> None:
        """Read the newest published version from the store (a thread: SQLite blocks)."""
        from clawproxy.store import Store

        if self._store is None:
            self._store = Store(self.cfg.db_path)
        row = self._store.serving_checkpoint()
        self.adapter_path = row["path"] if row is not None and row["kind"] == "lora" else None

    async def _poll(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.refresh)
            except Exception:  # a store hiccup must not end routing; the next poll tries again
                log.exception("model router: reading the published version failed")
            await asyncio.sleep(POLL_S)

    async def ctx(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: read once before serving, then poll in a named task owned here."""
        try:
            await asyncio.to_thread(self.refresh)
        except Exception:  # a broken store must not stop the serving: the base model until it reads
            log.exception("model router: reading the published version failed; serving the base model")
        task = asyncio.create_task(self._poll(), name="clawproxy-model-router")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self._store is not None:
            self._store.close()


def router_for(cfg: Config) -> ModelRouter | None:
    """A router when the upstream is a vLLM serving the trainer's LoRA adapter, else None."""
    if cfg.engine.kind == "vllm" and cfg.trainer.finetune == "lora":
        return ModelRouter(cfg)
    return None
