"""The embedded engine's own publish tests, with it as a real process: judged turns from its own
completions, one training step, publish, reload; it serves the new version (its answers say which)
and no request fails meanwhile; it refuses a checkpoint of another architecture atomically, and the
trainer records the refused step. The end-to-end path, on the real vLLM, is
tests/engine/test_vllm_real.py's ``test_trainer_step_publishes_into_real_vllm``.
"""

from __future__ import annotations

import pytest

from clawproxy.config import load_config
from clawproxy.engine.client import EngineClient
from clawproxy.store import Store
from tests.rig.engine_proc import chat, engine_process
from tests.rig.traffic import train_while_users_talk
from tests.trainer.util import insert_turn

QUESTIONS = ["What is 2+2?", "Name a fruit.", "Say hello.", "What color is the sky?"]


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The trainer here shares the CPU with the engine process: one torch thread, as
    tests/trainer/conftest.py gives the trainer tests."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _completion(url: str, question: str, seed: int) -> tuple[list, dict]:
    messages = [{"role": "user", "content": question}]
    r = chat(url, {"model": "m", "messages": messages, "max_tokens": 12, "temperature": 1.0, "seed": seed,
                   "logprobs": True, "return_token_ids": True})
    assert r.status_code == 200, r.text
    return messages, r.json()


def test_train_step_publishes_into_the_embedded_engine(tmp_path, tiny_model_dir):
    cfg = load_config(None, {"data_dir": str(tmp_path / "data"), "engine.kind": "embedded", "engine.model": str(tiny_model_dir),
                             "trainer.batch_size": 4, "trainer.learning_rate": 1e-3})
    store = Store(cfg.db_path)
    with engine_process(tiny_model_dir, tmp_path / "engine", "--threads", "1") as url:
        for i, q in enumerate(QUESTIONS):
            messages, body = _completion(url, q, i)
            choice = body["choices"][0]
            insert_turn(
                store, prompt_ids=body["prompt_token_ids"], completion_ids=choice["token_ids"],
                logps=[e["logprob"] for e in choice["logprobs"]["content"]],
                score=1 if i % 2 == 0 else -1, hint="Answer in one word." if i < 2 else None,
                weight_version=body["weight_version"], messages=messages,
                finish_reason="stop",  # a random-init model never stops by itself; treat as complete
            )
        engine = EngineClient(url)
        assert engine.weight_version() == 0

        from trainer.loop import Trainer

        trainer = Trainer(cfg, store, engine)
        def send() -> tuple[int, str]:
            r = chat(url, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
            return r.status_code, r.text

        result, failures = train_while_users_talk(trainer, send)
        assert result.status == "published", result.metrics.get("gate")
        # the trainer's log-probs of the recorded tokens match the engine's: ratio ~ 1 on-policy
        assert abs(result.metrics["ratio_mean"] - 1) < 1e-2 and result.metrics["kl_behaviour"] < 1e-3
        assert engine.weight_version() == 1
        _, body = _completion(url, "What is 2+2?", 99)
        assert body["weight_version"] == 1
        assert failures == []
        assert store.query_one("SELECT status FROM checkpoints WHERE version=1")["status"] == "published"
        assert [e["kind"] for e in store.query("SELECT kind FROM events")] == ["publish"]

        # the engine restarts on v0 (simulated by loading the base back): the trainer re-pushes v1
        engine.load_weights(str(tiny_model_dir), 0)
        trainer.collect()  # the trainer gives a restarted engine its version back
        assert engine.weight_version() == 1
    store.close()


def test_lora_adapter_publishes_into_the_embedded_engine(tmp_path, tiny_model_dir):
    """LoRA: the adapter directory is what the embedded engine loads (merged into its base weights)."""
    cfg = load_config(None, {"data_dir": str(tmp_path / "data"), "engine.kind": "embedded", "engine.model": str(tiny_model_dir),
                             "trainer.batch_size": 2, "trainer.learning_rate": 1e-2,
                             "trainer.finetune": "lora", "trainer.canary_max_tokens": 8,
                             # two +1 samples: with the leave-one-out baseline their advantage is 0
                             "trainer.baseline_window": 0})
    store = Store(cfg.db_path)
    with engine_process(tiny_model_dir, tmp_path / "engine", "--threads", "1") as url:
        for i, q in enumerate(QUESTIONS[:2]):
            messages, body = _completion(url, q, i)
            choice = body["choices"][0]
            insert_turn(store, prompt_ids=body["prompt_token_ids"], completion_ids=choice["token_ids"],
                        logps=[e["logprob"] for e in choice["logprobs"]["content"]], score=1,
                        weight_version=0, messages=messages, finish_reason="stop")
        from trainer.loop import Trainer

        probe = {"model": "m", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4,
                 "temperature": 0.0, "logprobs": True}
        before = [e["logprob"] for e in chat(url, probe).json()["choices"][0]["logprobs"]["content"]]
        engine = EngineClient(url)
        (result,) = Trainer(cfg, store, engine).run(steps=1)
        assert result.status == "published", result.metrics
        assert abs(result.metrics["ratio_mean"] - 1) < 1e-2
        assert engine.weight_version() == 1
        after = chat(url, probe).json()
        assert after["weight_version"] == 1
        # the adapter really is in the served weights: the same greedy request scores differently
        assert [e["logprob"] for e in after["choices"][0]["logprobs"]["content"]] != before
        assert (tmp_path / "data" / "checkpoints" / "v1" / "adapter_model.safetensors").exists()

        # a checkpoint the engine refuses (another architecture): the step is recorded as an
        # error, nothing is published, the engine keeps serving v1, the trainer keeps its weights
        other = _smaller_model(tiny_model_dir, tmp_path / "other-model")
        cfg2 = load_config(None, {"data_dir": str(tmp_path / "data2"), "engine.kind": "embedded", "engine.model": str(other),
                                  "trainer.batch_size": 1, "trainer.canary_max_tokens": 8})
        store2 = Store(cfg2.db_path)
        insert_turn(store2, prompt_ids=body["prompt_token_ids"], completion_ids=choice["token_ids"],
                    logps=[e["logprob"] for e in choice["logprobs"]["content"]], score=1, messages=messages)
        (refused,) = Trainer(cfg2, store2, engine).run(steps=1)
        assert refused.status == "error" and "engine_error" in refused.metrics
        assert engine.weight_version() == 1 and chat(url, probe).json()["weight_version"] == 1
        assert store2.query("SELECT * FROM checkpoints") == []
        assert [e["kind"] for e in store2.query("SELECT kind FROM events")] == ["reload_refused"]
        assert not (tmp_path / "data2" / "checkpoints" / "v1").exists()
        assert store2.query_one("SELECT COUNT(*) AS n FROM trained_samples")["n"] == 1  # refused: used up
        store2.close()
    store.close()


def _smaller_model(tiny_model_dir, out):
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(1)
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out
