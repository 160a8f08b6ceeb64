"""EngineClient against the fake vLLM server (vLLM needs a GPU) and its error handling.

The embedded engine side of the client is exercised against a real engine process in
test_engine_server.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from clawproxy.engine.client import EngineClient
from clawproxy.errors import EngineError
from tests.fakes.fake_vllm import CALLS, STATE, create_fake_vllm


@pytest.fixture
async def fake(aiohttp_server):
    server = await aiohttp_server(create_fake_vllm(api_key="sk-test"))
    return server


def _control_calls(server) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in server.app[CALLS] if not p.startswith("/v1/chat")]


async def test_vllm_full_reload_sequence(fake, tmp_path):
    ckpt = tmp_path / "v3"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    client = EngineClient(str(fake.make_url("/v1")), kind="vllm", token="sk-test")
    assert await asyncio.to_thread(client.health)
    assert await asyncio.to_thread(client.weight_version) == 0
    version = await asyncio.to_thread(client.load_weights, str(ckpt), 3)
    assert version == 3 and client.weight_version() == 3
    assert _control_calls(fake) == [
        ("GET", "/health"),
        ("POST", "/pause?mode=keep"),
        ("POST", "/collective_rpc"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/resume"),
    ]
    rpc = fake.app[CALLS][2][2]
    assert rpc == {"method": "reload_weights", "kwargs": {"weights_path": str(ckpt)}}
    assert fake.app[STATE]["weights_path"] == str(ckpt)
    assert not await asyncio.to_thread(client.is_paused)


async def test_vllm_refused_reload_resumes_and_keeps_version(fake, tmp_path):
    client = EngineClient(str(fake.make_url("")), kind="vllm", initial_version=5)
    with pytest.raises(EngineError) as info:
        await asyncio.to_thread(client.load_weights, str(tmp_path / "missing"), 6)
    assert "no checkpoint at" in info.value.message and info.value.status == 500
    assert client.weight_version() == 5
    assert _control_calls(fake)[-1] == ("POST", "/resume")
    assert not fake.app[STATE]["paused"]


async def test_pause_whose_answer_times_out_is_still_resumed(fake, tmp_path):
    """The engine paused but its answer came too late for the client: without a resume, every
    user request would be held forever."""
    fake.app[STATE]["pause_delay_s"] = 1.5
    client = EngineClient(str(fake.make_url("")), kind="vllm", reload_timeout=0.3)
    with pytest.raises(EngineError) as info:
        await asyncio.to_thread(client.load_weights, str(tmp_path), 1)
    assert info.value.status == 503 and client.weight_version() == 0
    assert ("POST", "/resume") in _control_calls(fake)
    await asyncio.sleep(1.5)  # the late pause answer has been sent
    assert not fake.app[STATE]["paused"]


async def test_vllm_lora_inplace_and_token(fake, tmp_path):
    adapter = tmp_path / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    client = EngineClient(str(fake.make_url("")), kind="vllm", token="sk-test")
    assert await asyncio.to_thread(client.load_weights, str(adapter), 1, True) == 1
    # A second update under the same name replaces the adapter in place.
    assert await asyncio.to_thread(client.load_weights, str(adapter), 2, True) == 2
    bodies = [b for m, p, b in fake.app[CALLS] if p == "/v1/load_lora_adapter"]
    assert bodies == [{"lora_name": "clawproxy", "lora_path": str(adapter), "load_inplace": True}] * 2
    assert fake.app[STATE]["loras"] == {"clawproxy": str(adapter)}

    wrong = EngineClient(str(fake.make_url("")), kind="vllm", token="nope")
    with pytest.raises(EngineError) as info:
        await asyncio.to_thread(wrong.load_weights, str(adapter), 3, True)
    assert info.value.status == 401 and "Unauthorized" in info.value.message
    assert wrong.weight_version() == 0


async def test_fake_vllm_chat_shapes(fake):
    """The fake speaks vLLM's chat shapes (what the proxy's fake-upstream tests rely on)."""
    import aiohttp

    async with aiohttp.ClientSession(headers={"Authorization": "Bearer sk-test"}) as s:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                "stream": True, "stream_options": {"include_usage": True},
                "return_token_ids": True, "logprobs": True}
        async with s.post(fake.make_url("/v1/chat/completions"), json=body) as r:
            raw = (await r.read()).decode()
    events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "prompt_token_ids" in chunks[0]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 7
    ids = [t for c in chunks[1:-1] for t in c["choices"][0]["token_ids"]]
    assert len(ids) == 7 and chunks[-2]["choices"][0]["finish_reason"] == "stop"


def test_unreachable_engine_is_an_engine_error():
    client = EngineClient("http://127.0.0.1:9", timeout=2)
    assert client.health() is False
    with pytest.raises(EngineError) as info:
        client.weight_version()
    assert info.value.status == 503 and "unreachable" in info.value.message


async def test_engine_reached_directly_despite_http_proxy(fake, monkeypatch):
    # A user's $http_proxy (here a dead one) must not stand between us and our engine.
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("no_proxy", "")
    client = EngineClient(str(fake.make_url("/v1")), kind="vllm", token="sk-test")
    assert await asyncio.to_thread(client.health)
