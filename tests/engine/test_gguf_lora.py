"""The in-process adapter writer (``engine/llamacpp/gguf_lora.py``) against llama.cpp's own
``convert_lora_to_gguf.py``: the same tensor names, shapes, types and values, and the same header
keys the adapter loader reads, on small random Llama (GQA: q/k rows permuted), Qwen2 and Qwen3
models with every projection adapted. The served result is checked end to end in
test_llamacpp.py (log-probs after a publish equal a PEFT forward pass)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clawproxy.engine.llamacpp.engine import _run_script
from clawproxy.engine.llamacpp.gguf_lora import convertible, gguf_module, write_adapter

HEADER_KEYS = ("general.architecture", "general.type", "adapter.type", "adapter.lora.alpha")
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def llama():
    from clawproxy.engine.llamacpp import build as llamacpp_build

    return llamacpp_build.build(echo=False)  # the source tree's scripts and gguf-py; cached once built


def _model_and_adapter(tmp_path, arch: str):
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model

    config_cls, model_cls = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
                             "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}[arch]
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**SMALL))
    base, adapter = tmp_path / "base", tmp_path / "adapter"
    model.save_pretrained(base)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False))
    peft.save_pretrained(adapter)
    return base, adapter


def _read(gguf, path):
    reader = gguf.GGUFReader(str(path))
    fields = {}
    for key in HEADER_KEYS:
        field = reader.get_field(key)
        assert field is not None, f"{path.name} has no {key}"
        fields[key] = field.contents()
    tensors = {t.name: (t.tensor_type, tuple(int(n) for n in t.shape), np.array(t.data)) for t in reader.tensors}
    return fields, tensors


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_written_adapter_equals_the_script(llama, tmp_path, arch):
    base, adapter = _model_and_adapter(tmp_path, arch)
    assert convertible(adapter, base) is None
    ours = write_adapter(llama.root, adapter, base, tmp_path / "ours.gguf")
    assert ours is not None
    theirs = tmp_path / "theirs.gguf"
    _run_script(llama, [str(llama.convert_lora), str(adapter), "--base", str(base), "--outtype", "f32",
                        "--outfile", str(theirs)])
    gguf = gguf_module(llama.root)
    our_fields, our_tensors = _read(gguf, ours)
    their_fields, their_tensors = _read(gguf, theirs)
    assert our_fields == their_fields
    assert sorted(our_tensors) == sorted(their_tensors)
    assert len(our_tensors) == 2 * len(TARGETS) * SMALL["num_hidden_layers"]
    for name, (kind, shape, data) in their_tensors.items():
        assert our_tensors[name][:2] == (kind, shape), name
        np.testing.assert_array_equal(our_tensors[name][2], data, err_msg=name)


def test_the_permuted_rows_matter(llama, tmp_path):
    """Leaving out Llama's q/k row order would fail the test above (a check that can fail)."""
    from clawproxy.engine.llamacpp import gguf_lora

    base, adapter = _model_and_adapter(tmp_path, "llama")
    gguf = gguf_module(llama.root)
    right = write_adapter(llama.root, adapter, base, tmp_path / "right.gguf")
    original = gguf_lora.ARCHITECTURES["LlamaForCausalLM"]
    gguf_lora.ARCHITECTURES["LlamaForCausalLM"] = ("LLAMA", False)
    try:
        wrong = write_adapter(llama.root, adapter, base, tmp_path / "wrong.gguf")
    finally:
        gguf_lora.ARCHITECTURES["LlamaForCausalLM"] = original
    _, right_t = _read(gguf, right)
    _, wrong_t = _read(gguf, wrong)
    assert not np.array_equal(right_t["blk.0.attn_q.weight.lora_b"][2], wrong_t["blk.0.attn_q.weight.lora_b"][2])
    np.testing.assert_array_equal(right_t["blk.0.attn_v.weight.lora_b"][2], wrong_t["blk.0.attn_v.weight.lora_b"][2])


def test_what_it_does_not_know_goes_to_the_script(tmp_path):
    base, adapter = tmp_path / "base", tmp_path / "adapter"
    base.mkdir()
    adapter.mkdir()
    (base / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    (adapter / "adapter_config.json").write_text(json.dumps({"lora_alpha": 8, "r": 4}))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    assert convertible(adapter, base) == "architecture GPT2LMHeadModel"
    (base / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    assert convertible(adapter, base) is None
    (adapter / "adapter_config.json").write_text(json.dumps({"lora_alpha": 8, "r": 4, "use_rslora": True}))
    assert convertible(adapter, base) == "adapter_config use_rslora"
    assert write_adapter(tmp_path, adapter, base, tmp_path / "x.gguf") is None
    assert not (tmp_path / "x.gguf").exists()
