"""The proxy keeps the user's model id stable in front of a vLLM serving the trained LoRA adapter:
the base model before the first publish, the adapter after, the adapter loaded again when vLLM
restarted without it (vLLM's 404 "The model `clawproxy` does not exist")."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from clawproxy.proxy.app import POLLER_KEY
from clawproxy.store import Store
from tests.engine.test_vllm_contract import write_adapter
from tests.fakes.fake_vllm import CALLS, STATE, create_fake_vllm, restart

MODEL = "Qwen/Qwen3-4B"
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture
async def routed(aiohttp_server, make_rig, tmp_path):
    vllm = await aiohttp_server(create_fake_vllm(model=MODEL))
    rig = await make_rig(upstream=str(vllm.make_url("")).rstrip("/"), **{
        "engine.kind": "vllm", "engine.model": MODEL, "trainer.finetune": "lora"})
    return rig, vllm.app, write_adapter(tmp_path / "v1")


def _models_sent(app) -> list[str]:
    return [b["model"] for m, p, b in app[CALLS] if p == "/v1/chat/completions"]


async def _publish(rig, app, adapter) -> None:
    """What the trainer does: load the adapter into vLLM, then record it as published."""
    app[STATE]["loras"]["clawproxy"] = str(adapter)
    store = Store(rig.cfg.db_path)
    store.insert("checkpoints", {"version": 1, "path": str(adapter), "kind": "lora", "created_at": 0.0,
                                 "status": "published"})
    store.close()
    await asyncio.to_thread(rig.app[POLLER_KEY].once)  # the poll would, within a second


async def test_base_model_until_the_first_adapter_then_the_adapter(routed):
    rig, app, adapter = routed
    status, _, body = await rig.chat(ASK)
    assert status == 200 and json.loads(body)["model"] == MODEL
    await _publish(rig, app, adapter)
    status, _, body = await rig.chat(ASK)
    assert status == 200, body
    assert _models_sent(app) == [MODEL, "clawproxy"]


async def test_adapter_lost_by_a_restart_is_loaded_again(routed):
    rig, app, adapter = routed
    await _publish(rig, app, adapter)
    restart(app)
    status, _, body = await rig.chat(ASK)
    assert status == 200, body
    assert app[STATE]["loras"] == {"clawproxy": str(adapter)}
    assert _models_sent(app) == ["clawproxy", "clawproxy"]  # 404, loaded again, retried
    assert [b for m, p, b in app[CALLS] if p == "/v1/load_lora_adapter"] == [
        {"lora_name": "clawproxy", "lora_path": str(adapter), "load_inplace": True}]
    await rig.wait_recorded(1)
    assert [r["http_status"] for r in rig.turns()] == [200]  # one turn, the retried one


async def test_adapter_that_cannot_be_loaded_again_falls_back_to_the_base_model(routed):
    rig, app, adapter = routed
    await _publish(rig, app, adapter)
    restart(app)
    shutil.rmtree(adapter)
    status, _, body = await rig.chat(ASK)
    assert status == 200, body
    assert _models_sent(app) == ["clawproxy", MODEL]


async def test_other_model_names_pass_untouched(routed):
    rig, app, adapter = routed
    await _publish(rig, app, adapter)
    status, _, body = await rig.chat({**ASK, "model": "someone-else"})
    assert status == 404 and b"does not exist" in body
    assert _models_sent(app) == ["someone-else"]



@pytest.mark.parametrize("stream", [False, True])
async def test_recorded_through_the_proxy_with_vllm_0_33_shapes(routed, stream):
    """Null ``token_ids``/``logprobs`` where not asked, ``reasoning`` not ``reasoning_content``: the
    proxy still records the sampled ids and log-probs, and the client gets what it asked for."""
    from tests.fakes.fake_vllm import CANNED_IDS, CANNED_TEXT

    rig, app, _ = routed
    status, _, body = await rig.chat({**ASK, "max_tokens": 50, "stream": stream})
    assert status == 200
    if not stream:
        choice = json.loads(body)["choices"][0]
        assert choice.get("token_ids") is None and choice["logprobs"] is None  # as the client asked
    await rig.wait_recorded(1)
    (turn,) = rig.turns()
    assert turn["response_text"] == CANNED_TEXT and turn["completion_token_ids"] == CANNED_IDS
    assert turn["completion_logprobs"] == [-0.5] * len(CANNED_IDS) and turn["model"] == MODEL


async def test_an_instructed_request_still_goes_to_the_adapter(routed):
    """Learning by trying rewrites the body after routing: the instruction rides on the routed
    model, not on the base model the client named."""
    from clawproxy.instruct import HINT_TEMPLATE

    rig, app, adapter = routed
    await _publish(rig, app, adapter)
    store = Store(rig.cfg.db_path)
    store.add_preference(None, "Answer in one sentence", "manual", status="active")
    store.close()
    await asyncio.to_thread(rig.app[POLLER_KEY].once)  # the poll would, within a second
    status, _, body = await rig.chat(ASK)
    assert status == 200, body
    sent = [b for m, p, b in app[CALLS] if p == "/v1/chat/completions"][-1]
    assert sent["messages"][-1]["content"].endswith(HINT_TEMPLATE.format(hint="Answer in one sentence."))
    assert sent["model"] == "clawproxy"
