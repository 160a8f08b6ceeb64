"""The vLLM contract (vllm_contract.py) against a real ``vllm serve`` on a CUDA GPU.

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

from tests.clawproxy.engine_proc import free_port
from tests.clawproxy.vllm_contract import *  # noqa: F403 (the shared contract tests)
from tests.clawproxy.vllm_contract import Target

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

    port = free_port()
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    log = open(root / "vllm.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(dirs["base"]), "--served-model-name",
         MODEL, "--port", str(port), "--api-key", "sk-gpu", "--enable-lora", "--max-lora-rank", "8",
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
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
