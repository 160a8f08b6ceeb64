"""OpenClaw's first turn from a warm prefix: the engine prefills, ahead of the first request, the
stable part of the system prompt it last served.

OpenClaw's system prompt starts with a part that is the same in every session, between
``<!-- openclaw:attempt:STABLE -->`` and ``<!-- /openclaw:attempt:STABLE -->`` (docs/openclaw-wire.md);
the dynamic part after it (the date, the runtime) changes. A session's first turn sends it all, and
on a CPU its prefill is the wait: 60 s for 1.8k tokens on llama.cpp on an AVX2 laptop, 0.5 s once
the prefix is cached (issue 61).

When: at start, after the engine restarts (its health check goes from down to up: every route is
cold) and after a publish (a route's weight version changes: that route is cold). A route is where a
user's requests go (``routing.Route``): an adapter by name, or the base model.

What: for each cold route, the system prompt of the newest turn its users were served (the store's
``last_prompts``), cut after the stable part's end mark (no mark: the whole system message), is
sent to the engine's own chat route under the route's model name with ``max_tokens`` 1, never
through the proxy (nothing is recorded). The engine keeps that KV as it keeps any prompt's: vLLM in
its prefix cache, whose block hashes include the adapter; llama.cpp in the slot that served it,
dropped when the slot's next request names another adapter, and with adapters loaded no RAM cache
(``--cache-ram 0``, engine/llamacpp/engine.py). So a request with another prompt or for another adapter
never reads this KV. A route none of whose users was served yet is left to its first request.

Never in the way: a warm-up starts only while no request is in flight, and a request that arrives
cancels it (the closed connection ends it in the engine: vLLM at its next prefill chunk, llama.cpp
at its next batch); the route stays cold and is warmed when the proxy is idle again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson

from clawproxy.config import Config
from clawproxy.proxy.addons import ProxyStats
from clawproxy.proxy.routing import ModelRouter, Route
from clawproxy.proxy.tap import Flow

log = logging.getLogger("clawproxy.proxy.warmup")

STABLE_END = "<!-- /openclaw:attempt:STABLE -->"
POLL_S = 1.0
RECENT_TURNS = 500  # the newest turns the last prompts are looked for in


def stable_part(messages: Any) -> str | None:
    """The stable part of a recorded request's system message (all of it without OpenClaw's end
    mark); None when the request has no system message with text. ``messages``: the list, or its JSON."""
    if isinstance(messages, str | bytes):
        try:
            messages = orjson.loads(messages)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return None
    first = messages[0]
    text = first.get("content")
    if first.get("role") not in ("system", "developer") or not isinstance(text, str) or not text:
        return None
    end = text.find(STABLE_END)
    return text[: end + len(STABLE_END)] if end >= 0 else text


class Warmup:
    """The addon (its ``request`` hook cancels a running warm-up) and the task that warms cold routes."""

    def __init__(self, cfg: Config, stats: ProxyStats, ready: Callable[[], bool] | None) -> None:
        self.cfg = cfg
        self.stats = stats
        self.ready = ready
        self.warm: set[tuple[str, int]] = set()  # (model, weight version) prefilled since the engine came up
        self.warmed = 0  # warm-ups that finished (the tests and /clawproxy/stats read it)
        self._current: asyncio.Task[None] | None = None

    def request(self, flow: Flow) -> None:
        if flow.admitted and self._current is not None and not self._current.done():
            self._current.cancel()

    async def ctx(self, router: ModelRouter, session: aiohttp.ClientSession) -> AsyncIterator[None]:
        """cleanup_ctx: the warm-up loop, a named task owned here."""
        task = asyncio.create_task(self._run(router, session), name="clawproxy-warmup")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self, router: ModelRouter, session: aiohttp.ClientSession) -> None:
        while True:
            try:
                await self._once(router, session)
            except asyncio.CancelledError:
                raise
            except Exception:  # a store or engine hiccup: the next poll tries again
                log.exception("warm-up failed; trying again")
            await asyncio.sleep(POLL_S)

    def _cold(self, router: ModelRouter) -> list[Route]:
        routes = {router.target(u) for u in (None, *router.routes)}
        return sorted((r for r in routes if (r.model, r.version) not in self.warm), key=lambda r: (r.model, r.version))

    async def _once(self, router: ModelRouter, session: aiohttp.ClientSession) -> None:
        if self.ready is not None and not self.ready():
            self.warm.clear()  # down, or restarting: what it had cached is gone
            return
        if not self._cold(router) or self.stats.in_flight:
            return
        prompts = await asyncio.to_thread(self._prompts, router)
        for route in self._cold(router):
            if self.stats.in_flight:
                return
            key = (route.model, route.version)
            text = prompts.get(route.model)
            if text is None:  # none of its users was served yet: the first request prefills it
                self.warm.add(key)
                continue
            self._current = asyncio.create_task(self._send(session, route, text), name="clawproxy-warmup-request")
            current = self._current
            try:
                await asyncio.wait({current})  # a request cancels it (the hook): no error here
            except asyncio.CancelledError:  # the proxy stops: the warm-up's request ends with it
                current.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await current
                raise
            finally:
                self._current = None
            if current.cancelled():
                log.info("warm-up of %s (v%d) gave way to a request; again when idle", route.model, route.version)
                return
            current.result()
            self.warm.add(key)

    def _prompts(self, router: ModelRouter) -> dict[str, str]:
        """Each route's model name -> the stable part its users were last served (newest first wins)."""
        from clawproxy.store import Store

        store = Store(self.cfg.db_path)
        try:
            rows = store.last_prompts(RECENT_TURNS)
        finally:
            store.close()
        out: dict[str, str] = {}
        for _, user, messages in rows:
            model = router.target(user).model
            if model not in out and (text := stable_part(messages)) is not None:
                out[model] = text
        return out

    async def _send(self, session: aiohttp.ClientSession, route: Route, text: str) -> None:
        body: dict[str, Any] = {"model": route.model, "messages": [{"role": "system", "content": text}],
                                "max_tokens": 1, "temperature": 0}
        token = self.cfg.engine.control_token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        t0 = time.monotonic()
        async with session.post(f"{self.cfg.engine_url}/v1/chat/completions", json=body, headers=headers) as r:
            answer = await r.read()
        if r.status != 200:  # e.g. a restarted vLLM that lost the adapter: its first request loads it again
            log.info("warm-up of %s (v%d): the engine answered %d (%s); left to the first request",
                     route.model, route.version, r.status, answer[:200].decode(errors="replace"))
            return
        self.warmed += 1
        log.info("warmed %s (v%d): %d characters of system prompt prefilled in %.1f s", route.model,
                 route.version, len(text), time.monotonic() - t0)
