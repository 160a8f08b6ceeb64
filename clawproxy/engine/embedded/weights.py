"""Loading new weights on the side and checking them before the engine swaps them in.

A reload must be atomic: either every parameter takes the new value or none does. So the new
state dict is read and validated completely (files exist, same keys, same shapes, all values
finite) before anything touches the serving model; only then does ``Engine`` copy it in under
its step lock. A refusal raises ``EngineError`` (HTTP 4xx) and the old weights keep serving.

Two checkpoint kinds, as the trainer writes them under ``<data_dir>/checkpoints/v<N>/``:
- a full Hugging Face directory: ``model.safetensors`` or sharded
  ``model.safetensors.index.json`` + shards;
- a PEFT LoRA adapter directory: ``adapter_config.json`` + ``adapter_model.safetensors``. It is
  merged into the *base* weights (those the engine started with), W = W0 + (alpha/r) * B @ A, as
  PEFT's ``merge_and_unload`` does, so successive adapters replace each other instead of stacking.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from clawproxy.errors import EngineError


def _refuse(message: str, code: str = "bad_checkpoint") -> EngineError:
    return EngineError(message, status=400, code=code)


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as err:
            raise _refuse(f"{index} is not a valid safetensors index: {err}") from None
        files = [path / s for s in shards]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise _refuse(f"checkpoint {path} is missing shard files: {missing}")
        return files
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    raise _refuse(
        f"checkpoint {path} has no model.safetensors (nor model.safetensors.index.json)",
        code="missing_file",
    )


def _read_safetensors(files: list[Path]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f), device="cpu"))
        except Exception as err:  # a truncated or corrupt file: refuse, never half-load
            raise _refuse(f"cannot read {f}: {err}") from None
    return state


def _check_against(
    new: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], where: Path
) -> dict[str, torch.Tensor]:
    """Same keys (a tied lm_head may be absent), same shapes, all finite; cast to the model dtype."""
    tied_optional = {"lm_head.weight"}
    missing = [k for k in reference if k not in new and k not in tied_optional]
    unexpected = [k for k in new if k not in reference]
    if missing or unexpected:
        raise _refuse(
            f"checkpoint {where} does not match the served model: "
            f"missing keys {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected keys {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}",
            code="key_mismatch",
        )
    out: dict[str, torch.Tensor] = {}
    for name, ref in reference.items():
        tensor = new.get(name)
        if tensor is None:
            continue
        if tuple(tensor.shape) != tuple(ref.shape):
            raise _refuse(
                f"checkpoint {where}: {name} has shape {tuple(tensor.shape)}, "
                f"the served model has {tuple(ref.shape)}",
                code="shape_mismatch",
            )
        if tensor.is_floating_point() and not _all_finite(tensor):
            raise _refuse(f"checkpoint {where}: {name} contains NaN or inf", code="non_finite")
        out[name] = tensor.to(ref.dtype)
    return out


def _all_finite(tensor: torch.Tensor) -> bool:
    """True when no element is NaN or inf.

    A sum is one streaming pass with no tensor-sized temporary (``isfinite().all()`` allocates a
    bool per element: 0.65 s vs 0.08 s for the default model; a float64 sum is slower still);
    any NaN or inf makes the sum non-finite. Only an overflowing sum of finite values would also
    be non-finite, so that case is settled by the exact check.
    """
    if bool(torch.isfinite(tensor.sum())):
        return True
    return bool(torch.isfinite(tensor).all())


def load_full_checkpoint(path: str | Path, reference: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Read and validate a full HF safetensors checkpoint against the served model's state dict."""
    where = Path(path)
    if not where.is_dir():
        raise _refuse(f"checkpoint directory {where} does not exist", code="missing_file")
    return _check_against(_read_safetensors(_safetensors_files(where)), reference, where)


def merge_lora(
    path: str | Path, base: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Read a PEFT LoRA adapter and return the merged tensors it changes (validated).

    Only the modules the adapter targets are returned; the caller copies them over the base.
    """
    where = Path(path)
    cfg_path = where / "adapter_config.json"
    if not cfg_path.exists():
        raise _refuse(f"LoRA adapter {where} has no adapter_config.json", code="missing_file")
    files = [where / "adapter_model.safetensors"]
    if not files[0].exists():
        raise _refuse(f"LoRA adapter {where} has no adapter_model.safetensors", code="missing_file")
    try:
        cfg: dict[str, Any] = json.loads(cfg_path.read_text())
    except ValueError as err:
        raise _refuse(f"{cfg_path} is not valid JSON: {err}") from None
    if cfg.get("fan_in_fan_out"):
        raise _refuse(f"LoRA adapter {where}: fan_in_fan_out adapters are not supported")
    r = int(cfg.get("r", 8))
    alpha = float(cfg.get("lora_alpha", r))
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    rank_pattern = cfg.get("rank_pattern") or {}
    alpha_pattern = cfg.get("alpha_pattern") or {}
    if rank_pattern or alpha_pattern:
        raise _refuse(f"LoRA adapter {where}: rank_pattern/alpha_pattern are not supported")
    adapter = _read_safetensors(files)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in adapter.items():
        # base_model.model.<module>.lora_A.weight  (PEFT may keep an adapter name: lora_A.default)
        stem = key.removeprefix("base_model.model.")
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in stem:
                module = stem.split(marker)[0]
                pairs.setdefault(module, {})[part] = tensor
                break
        else:
            raise _refuse(
                f"LoRA adapter {where}: unsupported tensor {key} (only lora_A/lora_B are merged)",
                code="key_mismatch",
            )
    merged: dict[str, torch.Tensor] = {}
    for module, ab in pairs.items():
        target = f"{module}.weight"
        if target not in base or "lora_A" not in ab or "lora_B" not in ab:
            raise _refuse(
                f"LoRA adapter {where}: module {module} is not in the served model or lacks A/B",
                code="key_mismatch",
            )
        a, b = ab["lora_A"].float(), ab["lora_B"].float()
        w = base[target]
        if a.dim() != 2 or b.dim() != 2 or (b.shape[0], a.shape[1]) != tuple(w.shape) or (
            b.shape[1] != a.shape[0]
        ):
            raise _refuse(
                f"LoRA adapter {where}: {module} has A{tuple(a.shape)} B{tuple(b.shape)}, "
                f"incompatible with weight {tuple(w.shape)}",
                code="shape_mismatch",
            )
        new = w.float() + scale * (b @ a)
        if not bool(torch.isfinite(new).all()):
            raise _refuse(f"LoRA adapter {where}: merging {module} gives NaN or inf", code="non_finite")
        merged[target] = new.to(w.dtype)
    if not merged:
        raise _refuse(f"LoRA adapter {where} contains no LoRA tensors", code="key_mismatch")
    return merged
