"""The bundled default model (SmolLM2-135M-Instruct) served by a real engine process: sensible
answers, and the recorded token ids and log-probs agree with a forward pass of the real weights."""

from __future__ import annotations

import pytest

from tests.rig.engine_proc import chat, engine_process, forward_logprobs, get, stream_chat


@pytest.fixture(scope="module")
def engine_url(default_model_dir, tmp_path_factory):
    with engine_process(default_model_dir, tmp_path_factory.mktemp("default-data")) as url:
        yield url


def test_default_model_answers_and_logprobs_are_exact(engine_url, default_model_dir):
    from transformers import AutoModelForCausalLM

    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 20, "temperature": 0, "logprobs": True, "return_token_ids": True}
    out = chat(engine_url, body).json()
    choice = out["choices"][0]
    assert "Paris" in choice["message"]["content"] and choice["finish_reason"] == "stop"
    ids = choice["token_ids"]
    assert ids[-1] == 2  # <|im_end|>: the EOS token is recorded, as the trainer needs it
    model = AutoModelForCausalLM.from_pretrained(default_model_dir).eval()
    want = forward_logprobs(model, out["prompt_token_ids"], ids)
    got = [e["logprob"] for e in choice["logprobs"]["content"]]
    assert got == pytest.approx(want, abs=2e-3)

    chunks, done, _ = stream_chat(engine_url, {**body, "stream_options": {"include_usage": True}})
    streamed = [t for c in chunks[1:] if c["choices"] for t in c["choices"][0].get("token_ids", [])]
    assert done and streamed == ids


def test_default_model_reports_its_own_context_length(engine_url):
    """No max_model_len set: the model's limit (what `clawproxy openclaw-config` reads)."""
    card = get(engine_url + "/v1/models").json()["data"][0]
    assert card["max_model_len"] == 8192  # SmolLM2-135M's max_position_embeddings
