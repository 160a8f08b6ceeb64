"""The vLLM contract: what clawproxy relies on from ``vllm serve``, as tests that run against any
server given as a ``target`` fixture (``Target``).

test_vllm_contract.py runs them against the fake (tests/fakes/fake_vllm.py), test_vllm_gpu.py
against a real ``vllm serve`` on a GPU; a test that needs one of the fake's failure knobs skips on
a real server. Import the tests with ``from tests.rig.vllm_contract import *``.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from clawproxy.engine.client import MIN_VLLM, EngineClient
from clawproxy.errors import EngineError
from tests.waits import assert_stays_sync
from trainer.checkpoints import CheckpointInvalid, Version, is_refusal, publish

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Target:
    url: str
    model: str  # the served (base) model name
    api_key: str | None
    base_dir: Path  # the served model's directory (the last good version 0)
    full_ckpt: Path  # a loadable full checkpoint of the served model
    adapter: Path  # a loadable LoRA adapter for it
    state: dict[str, Any] | None = None  # the fake's STATE (failure knobs); None: a real server

    def client(self, **kw: Any) -> EngineClient:
        return EngineClient(self.url, kind="vllm", token=self.api_key, **kw)

    def knobs(self) -> dict[str, Any]:
        if self.state is None:
            pytest.skip("needs the fake's failure knobs")
        return self.state


def chat(target: Target, body: dict[str, Any], timeout: float = 60) -> tuple[int, Any]:
    """POST /v1/chat/completions; (status, JSON body or the list of stream events)."""
    req = urllib.request.Request(
        target.url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json",
                 **({"Authorization": f"Bearer {target.api_key}"} if target.api_key else {})})
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            status, raw, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, raw, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
    if ctype.startswith("text/event-stream"):
        events = [json.loads(line[6:]) for line in raw.decode().splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        return status, events
    return status, json.loads(raw)


def ask(target: Target, model: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"model": model or target.model, "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 4, "temperature": 0, **extra}


# -- attach --------------------------------------------------------------------------------------


def test_attach_check_passes_and_version_is_at_least_the_floor(target):
    client = target.client()
    client.check_vllm(lora=True)
    assert client.version() >= MIN_VLLM


# -- full reload ---------------------------------------------------------------------------------


def test_full_reload_serves_and_reports_its_version(target):
    client = target.client()
    assert client.load_weights(str(target.full_ckpt), 3) == 3
    assert client.weight_version() == 3  # /weight_info after /update_weight_version
    assert not client.is_paused()
    status, body = chat(target, ask(target))
    assert status == 200, body
    client.load_weights(str(target.base_dir), 4)  # back to the base weights for the next test


def test_invalid_checkpoint_is_refused_before_the_engine_is_asked(target, tmp_path):
    client = target.client()
    bad = tmp_path / "v9"
    bad.mkdir()
    (bad / "config.json").write_text((target.full_ckpt / "config.json").read_text())
    src = next(target.full_ckpt.glob("*.safetensors"))
    (bad / src.name).write_bytes(src.read_bytes()[:-1])  # one byte short
    before = client.weight_version()
    with pytest.raises(CheckpointInvalid, match="not fully covered"):
        publish(client, Version(9, bad, "full"), Version(before, target.base_dir, "full"), target.base_dir)
    assert client.weight_version() == before
    assert chat(target, ask(target))[0] == 200


def test_failed_full_reload_loses_the_weights_and_publish_puts_the_last_good_back(target):
    state = target.knobs()
    client = target.client()
    state["fail_reload"] = True
    with pytest.raises(EngineError) as info:
        client.load_weights(str(target.full_ckpt), 5)
    assert info.value.status == 500 and is_refusal(info.value)
    assert chat(target, ask(target))[0] == 500  # not atomic: the old weights do not keep serving
    state["fail_reload"] = True
    with pytest.raises(EngineError):
        publish(client, Version(5, target.full_ckpt, "full"), Version(0, target.base_dir, "full"))
    assert state["weights_path"] == str(target.base_dir)
    assert chat(target, ask(target))[0] == 200


# -- LoRA ----------------------------------------------------------------------------------------


def test_lora_adapter_is_listed_and_served_under_its_name(target):
    client = target.client()
    client.load_weights(str(target.adapter), 1, lora=True)
    assert client.served_adapters() == {"clawproxy": str(target.adapter)}
    status, body = chat(target, ask(target, "clawproxy"))
    assert status == 200 and body["model"] == "clawproxy", body
    client.load_weights(str(target.adapter), 2, lora=True)  # again, in place: no "already loaded"


def test_unknown_model_is_a_404_in_vllms_error_shape(target):
    status, body = chat(target, ask(target, "no-such-adapter"))
    assert status == 404
    err = body["error"]
    assert err["type"] == "NotFoundError" and err["code"] == 404 and err["param"] == "model"
    assert "The model `no-such-adapter` does not exist" in err["message"]


def test_lora_without_adapter_files_is_a_404_refusal(target, tmp_path):
    with pytest.raises(EngineError) as info:
        target.client().load_weights(str(tmp_path / "nothing-here"), 7, lora=True)
    assert info.value.status == 404 and is_refusal(info.value)
    assert not target.client().is_paused()


def test_lora_broken_adapter_is_a_500_refusal(target, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text((target.adapter / "adapter_config.json").read_text())
    (broken / "adapter_model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(EngineError) as info:
        target.client().load_weights(str(broken), 8, lora=True)
    assert info.value.status == 500 and is_refusal(info.value)


# -- pause modes, prefix cache -------------------------------------------------------------------


QUEUES_DURING_PAUSE = (0, 33, 0)  # vLLM 0.33 answers 503 during abort/wait pauses; 0.32 queues
HELD_WINDOW_S = 1.0  # a request let through answers ask()'s 4 tokens well within this


@pytest.mark.parametrize("mode", ["abort", "wait"])
def test_abort_and_wait_pauses_refuse_or_queue_new_requests_by_version(target, mode):
    client = target.client()
    if client.version() < QUEUES_DURING_PAUSE:
        client.pause(mode)
        out: list[tuple[int, Any]] = []
        t = threading.Thread(target=lambda: out.append(chat(target, ask(target))))
        try:
            t.start()
            # a window to fail in: a held request never ends, so no event can say "held"
            assert_stays_sync(lambda: t.is_alive() and not out, f"a new request held during a {mode} pause",
                              HELD_WINDOW_S)
        finally:
            client.resume()
        t.join(60)
        assert out and out[0][0] == 200
        return
    client.pause(mode)
    try:
        status, body = chat(target, ask(target))
    finally:
        client.resume()
    assert status == 503 and body["error"]["code"] == 503, body
    assert chat(target, ask(target))[0] == 200


def test_keep_pause_holds_new_requests_until_resume(target):
    client = target.client()
    client.pause("keep")
    out: list[tuple[int, Any]] = []
    t = threading.Thread(target=lambda: out.append(chat(target, ask(target))))
    try:
        t.start()
        # a window to fail in: a held request never ends, so no event can say "held"
        assert_stays_sync(lambda: t.is_alive() and not out, "a new request held while paused in keep mode",
                          HELD_WINDOW_S)
    finally:
        client.resume()
    t.join(60)
    assert out and out[0][0] == 200


def test_reset_prefix_cache_reports_success_when_idle(target):
    assert target.client().reset_prefix_cache() is True


# -- response shapes -----------------------------------------------------------------------------


def test_stream_chunks_carry_null_token_ids_and_logprobs_when_not_asked(target):
    status, events = chat(target, ask(target, stream=True))
    assert status == 200
    content = [e for e in events if e["choices"] and "role" not in e["choices"][0]["delta"]]
    assert content and all(e["choices"][0]["token_ids"] is None and e["choices"][0]["logprobs"] is None
                           for e in content)
    assert events[0]["prompt_token_ids"] is None
    status, events = chat(target, ask(target, stream=True, return_token_ids=True, logprobs=True))
    content = [e for e in events if e["choices"] and "role" not in e["choices"][0]["delta"]]
    assert all(isinstance(e["choices"][0]["token_ids"], list) for e in content)
    assert isinstance(events[0]["prompt_token_ids"], list)


def test_message_names_reasoning_not_reasoning_content(target):
    status, body = chat(target, ask(target))
    message = body["choices"][0]["message"]
    assert "reasoning" in message and "reasoning_content" not in message
    assert body["choices"][0]["token_ids"] is None and body["prompt_token_ids"] is None


def test_model_cards(target):
    client = target.client()
    cards = client._request("GET", "/v1/models")["data"]
    base = cards[0]
    assert base["id"] == target.model and base["parent"] is None and base["owned_by"] == "vllm"
    assert isinstance(base["max_model_len"], int) and base["permission"][0]["object"] == "model_permission"
    client.load_weights(str(target.adapter), 1, lora=True)
    card = next(c for c in client._request("GET", "/v1/models")["data"] if c["id"] == "clawproxy")
    assert card["parent"] == target.model and card["root"] == str(target.adapter)
    assert card["max_model_len"] is None
