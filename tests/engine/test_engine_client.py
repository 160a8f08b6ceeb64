"""EngineClient's own error handling (the vLLM contract is in test_vllm_contract.py; the embedded
engine side runs against a real engine process in test_engine_server.py)."""

from __future__ import annotations

import json

import pytest

from clawproxy.engine.client import EngineClient, _version_tuple
from clawproxy.errors import EngineError
from tests.fakes.fake_vllm import CALLS, STATE, create_fake_vllm
from tests.fakes.serve import serve_in_thread


@pytest.fixture
def fake():
    app = create_fake_vllm(api_key="sk-test")
    with serve_in_thread(app) as url:
        yield app, url


def test_pause_whose_answer_times_out_is_still_resumed(fake, tmp_path):
    """The engine paused but its answer came too late for the client: without a resume, every
    user request would be held forever."""
    app, url = fake
    app[STATE]["pause_delay_s"] = 1.5
    client = EngineClient(url, kind="vllm", reload_timeout=0.3)
    with pytest.raises(EngineError) as info:
        client.load_weights(str(tmp_path), 1)
    assert info.value.status == 503 and client.weight_version() == 0
    assert ("POST", "/resume") in [(m, p) for m, p, _ in app[CALLS]]
    assert app[STATE]["pause_answered"].wait(10)  # the late pause answer has been sent
    assert app[STATE]["pause_mode"] is None


def test_lora_body_is_inplace_under_one_name(fake, tmp_path):
    app, url = fake
    adapter = tmp_path / "lora"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (adapter / "adapter_model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    client = EngineClient(url, kind="vllm", token="sk-test")
    assert client.load_weights(str(adapter), 1, True) == 1
    assert client.load_weights(str(adapter), 2, True) == 2
    bodies = [b for m, p, b in app[CALLS] if p == "/v1/load_lora_adapter"]
    assert bodies == [{"lora_name": "clawproxy", "lora_path": str(adapter), "load_inplace": True}] * 2


def test_fake_vllm_stream_shapes(fake):
    """The fake's stream (what the proxy's fake-upstream tests rely on)."""
    import urllib.request

    _, url = fake
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True, "logprobs": True}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer sk-test", "Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req) as r:
        raw = r.read().decode()
    events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 7
    ids = [t for c in chunks[1:-1] for t in c["choices"][0]["token_ids"]]
    assert len(ids) == 7 and chunks[-2]["choices"][0]["finish_reason"] == "stop"


def test_unreachable_engine_is_an_engine_error():
    client = EngineClient("http://127.0.0.1:9", timeout=2)
    assert client.health() is False
    with pytest.raises(EngineError) as info:
        client.weight_version()
    assert info.value.status == 503 and "unreachable" in info.value.message


def test_engine_reached_directly_despite_http_proxy(fake, monkeypatch):
    # A user's $http_proxy (here a dead one) must not stand between us and our engine.
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("no_proxy", "")
    assert EngineClient(fake[1] + "/v1", kind="vllm", token="sk-test").health()


@pytest.mark.parametrize("text, want", [("0.33.0", (0, 33, 0)), ("0.16.0rc1.dev12+gabc", (0, 16, 0)),
                                        ("0.11.2", (0, 11, 2)), ("", None)])
def test_version_tuple(text, want):
    assert _version_tuple(text) == want
