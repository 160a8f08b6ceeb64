"""Shared fixtures: real models, small enough for a 2-core CPU.

- ``default_model_dir``: the bundled SmolLM2-135M-Instruct converted to safetensors once and cached
  in ``$CLAWPROXY_MODEL_CACHE`` (default ``~/.cache/clawproxy/models``) across test runs.
- ``tiny_model_dir``: a random-init 2-layer Llama with SmolLM2's tokenizer and chat template, for
  tests where the weights' quality is not the point; ``tiny_vllm_model_dir``: the same with
  attention heads the real vLLM serves.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# importing TRL sets VLLM_LOGGING_LEVEL=ERROR when unset (trl/_compat.py), and every vLLM a later test
# starts would inherit it: its engine.log would lose vLLM's INFO lines, which `clawproxy start` keeps
os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
os.environ.setdefault(
    "CLAWPROXY_MODEL_CACHE", str(Path.home() / ".cache" / "clawproxy" / "models")
)


@pytest.fixture(autouse=True)
def _engine_auto_is_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """``engine.kind: auto`` (the default) chooses vLLM in every test, whatever this CPU's flags:
    the tests of the choice itself fake the machine (tests/engine/test_auto.py)."""
    import clawproxy.config
    from clawproxy.engine_choice import Machine

    machine = Machine(cpu_flags=frozenset({"avx512_bf16"}), gpu=False, vllm=True, llamacpp=True)
    monkeypatch.setattr(clawproxy.config, "this_machine", lambda device: machine)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    from clawproxy.engine.model import resolve_model

    return Path(resolve_model("default"))


@pytest.fixture(scope="session")
def tiny_model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_llama(default_model_dir, tmp_path_factory.mktemp("tiny-model"), hidden_size=64,
                       intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="session")
def tiny_vllm_model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # heads of 64, as SmolLM2's: vLLM's CPU attention serves none under 32 (tiny_model_dir's are 16)
    return _tiny_llama(default_model_dir, tmp_path_factory.mktemp("tiny-vllm-model"), hidden_size=128,
                       intermediate_size=256, num_attention_heads=2, num_key_value_heads=1)


def _tiny_llama(default_model_dir: Path, out: Path, **sizes: int) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        num_hidden_layers=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **sizes,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


from tests.rig.proxy_rig import make_rig, rig  # noqa: E402,F401 (the proxy rig, for every test folder)
