"""A PEFT LoRA adapter as a llama.cpp GGUF adapter, written in the engine process.

llama.cpp's ``convert_lora_to_gguf.py`` starts a new Python that imports torch, transformers and
its model classes: most of a publish's time (bench/results/i51). For the architectures whose
conversion only renames tensors (Qwen2, Qwen3) or also permutes the rows of q/k (Llama, Mistral),
this writes the same file with numpy and the tree's own ``gguf-py``: the same tensor names (its
name map), the same rows, the same header keys the adapter loader reads (``general.type``,
``general.architecture``, ``adapter.type``, ``adapter.lora.alpha``), all float32 as the trainer's.
Anything else returns None and the caller runs the script (tests/engine/test_gguf_lora.py checks
both give the same tensors).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

# Hugging Face architecture -> (gguf-py's MODEL_ARCH member, q/k rows permuted as LlamaModel.permute)
ARCHITECTURES = {
    "Qwen2ForCausalLM": ("QWEN2", False),
    "Qwen3ForCausalLM": ("QWEN3", False),
    "LlamaForCausalLM": ("LLAMA", True),
    "MistralForCausalLM": ("LLAMA", True),
}
# adapter_config.json settings that change the math llama.cpp applies (scale alpha / rank, one alpha)
UNSUPPORTED = ("use_rslora", "use_dora", "rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform")


def gguf_module(tree: Path) -> ModuleType:
    """The ``gguf`` package of the pinned llama.cpp tree (the one its server reads)."""
    path = str(tree / "gguf-py")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module("gguf")


def _permute(rows: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """``LlamaModel.permute`` (conversion/llama.py) on LoRA B, whose rows are the weight's rows."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))


def convertible(adapter_dir: Path, base_dir: Path) -> str | None:
    """Why this adapter needs llama.cpp's script (None: it does not)."""
    try:
        hparams = json.loads((base_dir / "config.json").read_text())
        lparams = json.loads((adapter_dir / "adapter_config.json").read_text())
    except (OSError, ValueError) as err:
        return f"unreadable config: {err}"
    arch = (hparams.get("architectures") or [None])[0]
    if arch not in ARCHITECTURES:
        return f"architecture {arch}"
    if not (adapter_dir / "adapter_model.safetensors").exists():
        return "no adapter_model.safetensors"
    for key in UNSUPPORTED:
        if lparams.get(key):
            return f"adapter_config {key}"
    return None


def write_adapter(tree: Path, adapter_dir: Path, base_dir: Path, out: Path) -> Path | None:
    """Write ``adapter_dir`` as a GGUF LoRA adapter at ``out``; None when the script must do it."""
    if convertible(adapter_dir, base_dir) is not None:
        return None
    from safetensors.numpy import load_file

    gguf = gguf_module(tree)
    hparams: dict[str, Any] = json.loads((base_dir / "config.json").read_text())
    lparams: dict[str, Any] = json.loads((adapter_dir / "adapter_config.json").read_text())
    arch_member, permutes = ARCHITECTURES[hparams["architectures"][0]]
    arch = getattr(gguf.MODEL_ARCH, arch_member)
    names = gguf.get_tensor_name_map(arch, int(hparams["num_hidden_layers"]))
    n_head = int(hparams["num_attention_heads"])
    n_kv = int(hparams.get("num_key_value_heads") or n_head)

    pairs: dict[str, dict[str, np.ndarray]] = {}
    for name, tensor in load_file(str(adapter_dir / "adapter_model.safetensors")).items():
        side = "a" if ".lora_A.weight" in name else "b" if ".lora_B.weight" in name else None
        if side is None:
            return None  # embeddings, norms or a base layer in the adapter: the script knows those
        base = name.replace("base_model.model.", "").replace(f".lora_{side.upper()}.weight", ".weight")
        pairs.setdefault(base, {})[side] = tensor
    tensors: list[tuple[str, np.ndarray]] = []
    for base, pair in pairs.items():
        dest = names.get_name(base, try_suffixes=(".weight", ".bias"))
        if dest is None or set(pair) != {"a", "b"}:
            return None
        lora_a, lora_b = pair["a"].astype(np.float32), pair["b"].astype(np.float32)
        if permutes and base.endswith("q_proj.weight"):
            lora_b = _permute(lora_b, n_head, n_head)
        elif permutes and base.endswith("k_proj.weight"):
            lora_b = _permute(lora_b, n_head, n_kv)
        tensors += [(dest + ".lora_a", lora_a), (dest + ".lora_b", lora_b)]
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(lparams["lora_alpha"]))
    for dest, data in tensors:
        writer.add_tensor(dest, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
