"""clawproxy's engine server (engine/server.py) frees the engine when a client leaves during a
prefill: nothing is written before the first token, so aiohttp would notice nothing until then (a
minute for a long prompt on llama.cpp on a laptop CPU). The engine here never answers; the server
is served as `python -m clawproxy.engine` serves it (no handler cancellation)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from clawproxy.engine.generation import GenRequest
from clawproxy.engine.server import ServerSettings, create_app
from tests.waits import until


class Prefilling:
    """A Serving that takes requests and never emits a token: a prefill that does not end."""

    adapters_by_name = False
    weight_version = 0
    is_paused = False

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tokenizer_lock = threading.Lock()
        self.submitted: list[GenRequest] = []
        self.cancelled: list[GenRequest] = []

    def load(self) -> dict[str, int | float]:
        return {"running": len(self.submitted) - len(self.cancelled)}

    def start(self) -> None: ...
    def stop(self, timeout: float = 10.0) -> None: ...

    def submit(self, req: GenRequest) -> None:
        self.submitted.append(req)

    def cancel(self, req: GenRequest) -> None:
        req.cancelled = True
        self.cancelled.append(req)


@pytest.fixture
async def prefilling(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    engine = Prefilling(AutoTokenizer.from_pretrained(tiny_model_dir))
    app = create_app(engine, ServerSettings("tiny", str(tiny_model_dir), 2048))  # type: ignore[arg-type]
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    yield engine, f"http://{host}:{port}"
    await runner.cleanup()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_that_leaves_during_the_prefill_frees_the_engine(prefilling, stream):
    engine, url = prefilling
    body = {"model": "tiny", "messages": [{"role": "system", "content": "A long stable prompt."}],
            "max_tokens": 1, "stream": stream}

    async def ask() -> None:
        async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body) as r:
            await r.read()

    task = asyncio.create_task(ask())
    await until(lambda: engine.submitted, "the request to reach the engine")
    await asyncio.sleep(0.7)  # still prefilling: nothing cancelled while the client waits
    assert engine.cancelled == []
    task.cancel()
    await until(lambda: engine.cancelled == engine.submitted, "the engine to be told the client left", timeout=5)
