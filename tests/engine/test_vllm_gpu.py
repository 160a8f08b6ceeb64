"""The vLLM contract (vllm_contract.py) against a real ``vllm serve`` on a CUDA GPU, and one
trainer step published into it (full and LoRA).

Runs when vllm is importable and a GPU is present; skips with the reason otherwise. The server
serves a small random-init Qwen3 (head_dim 64, which every vLLM attention backend supports) with
the bundled SmolLM2 tokenizer, built here: no download.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.net import held_port
from tests.rig.vllm_contract import *  # noqa: F403 (the shared contract tests)
from tests.rig.vllm_contract import Target

pytestmark = pytest.mark.gpu

MODEL = "tiny-qwen3"


def _skip_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install -e '.[vllm]' on a GPU machine)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU"
    return None


@pytest.fixture(scope="module")
def target(default_model_dir, tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    root = tmp_path_factory.mktemp("vllm-gpu")
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    config = Qwen3Config(vocab_size=len(tok), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         torch_dtype="bfloat16")
    dirs = {}
    for name, seed in (("base", 0), ("v1", 1)):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(root / name, safe_serialization=True)
        tok.save_pretrained(root / name)
        dirs[name] = root / name
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                  task_type="CAUSAL_LM"))
    peft_model.save_pretrained(root / "adapter")

    hold = held_port()  # bound, not listening, until vllm serve takes it (SO_REUSEADDR)
    port = hold.__enter__()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    log = open(root / "vllm.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(dirs["base"]), "--served-model-name",
         MODEL, "--port", str(port), "--api-key", "sk-gpu", "--enable-lora", "--max-lora-rank", "16",
         "--max-model-len", "1024", "--gpu-memory-utilization", "0.3", "--enforce-eager"],
        stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited {proc.returncode}; see {root / 'vllm.log'}")
            try:
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url + "/health", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vllm serve not healthy in 300 s; see {root / 'vllm.log'}") from None
                time.sleep(2)
        yield Target(url, MODEL, "sk-gpu", dirs["base"], dirs["v1"], root / "adapter")
    finally:
        hold.__exit__(None, None, None)
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_trainer_step_publishes_into_real_vllm(target, tmp_path, finetune):
    from clawproxy.config import load_config
    from clawproxy.store import Store
    from tests.rig.vllm_contract import ask, chat
    from tests.trainer.test_loop import _add
    from trainer.loop import Trainer

    cfg = load_config(None, {
        "data_dir": str(tmp_path / "data"), "engine.model": str(target.base_dir), "engine.kind": "vllm",
        "engine.dtype": "bfloat16", "engine.control_token": target.api_key, "trainer.finetune": finetune,
        "trainer.batch_size": 2, "trainer.learning_rate": 1e-3, "trainer.lora_r": 16,
        "trainer.canary_prompts": ["Say hi."], "trainer.canary_max_tokens": 8})
    store = Store(cfg.db_path)
    _add(store, target.base_dir, 2)
    engine = target.client()
    (result,) = Trainer(cfg, store, engine).run(steps=1)
    assert result.status == "published", result.metrics
    v1 = cfg.data_path / "checkpoints" / "v1"
    if finetune == "lora":
        assert engine.served_adapters()["clawproxy"] == str(v1)
        assert chat(target, ask(target, "clawproxy"))[0] == 200
    else:
        assert engine.weight_version() == 1
        assert chat(target, ask(target))[0] == 200
        engine.load_weights(str(target.base_dir), 2)
