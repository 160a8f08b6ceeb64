"""4-bit weights for vLLM on a CPU (``engine.quantization: w4a16``), made here from the model we have.

Decoding on a CPU reads every weight once per token, so its speed is bounded by memory bandwidth
divided by the bytes read per token (``bench/bandwidth.py``). In bfloat16 the 1.5B reads ~3.1 GB a
token; with its linear layers in 4 bits, ~1.1 GB (the tied embedding, which is also the output
head, stays bfloat16: vLLM quantizes no tied head).

The format is compressed-tensors' ``pack-quantized`` W4A16 (the ``W4A16`` preset: int4 weights,
symmetric, one scale per group of 128 inputs; activations stay bfloat16), which vLLM CPU serves with
``CPUWNA16LinearKernel`` and under which its LoRA layers work. Round-to-nearest, no calibration
data: each group's scale comes from its largest weight (compressed-tensors' ``calculate_qparams``,
what llm-compressor's min-max observer feeds it), rounded to bfloat16 first so that the integers are
chosen against the scale vLLM will multiply by. compressed-tensors quantizes, packs and writes the
config; only the per-group min and max are computed here.

The quantized directory is made once and cached beside the source (``<source>-w4a16``), stamped
with what it was made from (``QUANT_FILE``): a source that changed is quantized again. It is for
serving only: the trainer trains the unquantized weights and publishes LoRA adapters, which vLLM
applies on top of the 4-bit layers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Literal

from clawproxy.errors import ConfigError

log = logging.getLogger(__name__)

Quantization = Literal["none", "w4a16"]
GROUP_SIZE = 128
QUANT_FILE = "clawproxy_quantized.json"  # in a quantized directory: its scheme and its source


def scheme(group_size: int = GROUP_SIZE) -> Any:
    """compressed-tensors' W4A16 preset (int4, symmetric, grouped) on every Linear but the head."""
    from compressed_tensors.quantization import QuantizationScheme, preset_name_to_scheme

    preset: QuantizationScheme = preset_name_to_scheme("W4A16", targets=["Linear"])
    assert preset.weights is not None
    preset.weights.group_size = group_size
    return preset


def source_stamp(source: Path) -> dict[str, Any]:
    """What identifies the source weights: its catalog stamp (size + sha256 of the GGUF) when it has
    one, else the size and mtime of each weight file."""
    from clawproxy.catalog import SOURCE_FILE

    stamp: dict[str, Any] = {"path": str(source.resolve())}
    try:
        stamp["catalog"] = json.loads((source / SOURCE_FILE).read_text())
        return stamp
    except (OSError, ValueError):
        pass
    stamp["files"] = {f.name: [f.stat().st_size, f.stat().st_mtime_ns]
                      for f in sorted(source.glob("*.safetensors"))}
    return stamp


def quantized_dir(source: Path, data_dir: str | os.PathLike | None, quantization: str) -> Path:
    """Where the ``quantization`` of ``source`` lives: beside it when it is a named model in the
    shared cache, else in the converted-model cache under its name and a digest of its path."""
    from clawproxy.catalog import model_cache_dir
    from clawproxy.engine.model import cache_dir

    source = source.resolve()
    if source.parent == model_cache_dir().resolve():
        return source.parent / f"{source.name}-{quantization}"
    digest = hashlib.sha1(str(source).encode()).hexdigest()[:10]
    return cache_dir(data_dir) / f"{source.name}-{digest}-{quantization}"


def is_quantized(out: Path, source: Path, quantization: str) -> bool:
    """Whether ``out`` is a finished ``quantization`` of ``source`` as it is now."""
    try:
        stamp = json.loads((out / QUANT_FILE).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("quantization") == quantization and stamp.get("source") == source_stamp(source)


def quantize_w4a16(source: Path, out: Path, group_size: int = GROUP_SIZE) -> Path:
    """Write ``source`` (a Hugging Face directory) as a compressed-tensors W4A16 checkpoint at ``out``
    (atomically), its other tensors in bfloat16."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clawproxy.convert import write_dir_atomically

    log.info("quantizing %s to 4 bits (W4A16, groups of %d) in %s (once)", source, group_size, out)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(source)
    w4 = scheme(group_size)
    config = QuantizationConfig(config_groups={"group_0": w4}, ignore=["lm_head"])
    apply_quantization_config(model, config)
    quantized = [(name, m) for name, m in model.named_modules() if getattr(m, "quantization_scheme", None)]
    for name, module in quantized:
        weight = module.weight.detach()
        rows, cols = weight.shape
        if cols % group_size:
            raise ConfigError(f"{source}: {name} has {cols} inputs, not a multiple of the 4-bit group "
                              f"size {group_size}; serve this model with engine.quantization: none")
        groups = weight.reshape(rows, cols // group_size, group_size)
        scale, zero_point = calculate_qparams(groups.amin(-1), groups.amax(-1), w4.weights)
        # vLLM multiplies by the scale in bfloat16: choose the integers against that value
        module.weight_scale.data.copy_(scale.to(torch.bfloat16).float())
        module.weight_zero_point.data.copy_(zero_point)
    if not quantized:
        raise ConfigError(f"{source}: no linear layer to quantize")
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    model.to(torch.bfloat16)  # the rest (embedding, norms, biases, scales) as vLLM serves them
    stamp = {"quantization": "w4a16", "group_size": group_size, "source": source_stamp(source),
             "layers": len(quantized)}

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        compressor.update_config(str(tmp))
        tokenizer.save_pretrained(tmp)
        for extra in ("generation_config.json",):  # the sampling defaults the catalog wrote
            if (source / extra).exists():
                (tmp / extra).write_bytes((source / extra).read_bytes())
        (tmp / QUANT_FILE).write_text(json.dumps(stamp, indent=1) + "\n")

    return write_dir_atomically(out, save)


def quantized_model(source: Path, data_dir: str | os.PathLike | None, quantization: str) -> Path:
    """The directory vLLM serves for ``quantization`` of ``source``: made once, then found by its stamp."""
    if quantization == "none":
        return source
    if quantization != "w4a16":
        raise ConfigError(f"engine.quantization={quantization!r}: use none or w4a16")
    if not (source / "config.json").exists():
        raise ConfigError(f"engine.quantization: w4a16 needs a local model directory; {source} has no "
                          "config.json (a Hugging Face id is not quantized here)")
    out = quantized_dir(source, data_dir, quantization)
    if not is_quantized(out, source, quantization):
        quantize_w4a16(source, out)
    return out
