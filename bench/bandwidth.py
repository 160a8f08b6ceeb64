"""What this machine can do at best, the bounds a serving mode is measured against:

- memory bandwidth: a large-array copy (read + write bytes) and a large-array sum (read bytes only:
  what decoding does with the weights), each at the thread counts given;
- matmul FLOP/s: a prefill-shaped GEMM (tokens x hidden @ hidden x intermediate) in float32, in
  bfloat16 the way vLLM CPU's linear layers run it (its oneDNN GEMM, or torch's linear where oneDNN
  has none for this CPU), and with 4-bit weights through PyTorch's int4 kernel.

Decode reads every weight once per token, so its bound is read bandwidth / bytes of weights per
token; prefill's is FLOP/s / (2 x weights' parameters) tokens/s. The figures are best-of-N (a
shared machine only ever makes them lower) with the median beside them.

    .venv/bin/python bench/bandwidth.py                    # 1 thread (vLLM's auto binding here)
    .venv/bin/python bench/bandwidth.py --threads 1 2 --json bench/results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def _timed(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # first touch: page faults and caches are not what is measured
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _rates(work: float, times: list[float]) -> dict[str, float]:
    return {"best": work / min(times), "median": work / statistics.median(times)}


def memory_bandwidth(threads: int, gib: float = 1.0, repeats: int = 5) -> dict[str, Any]:
    """GB/s (1e9 bytes) of a ``gib``-GiB float32 copy (read + write) and sum (read), on ``threads``."""
    import torch

    torch.set_num_threads(threads)
    n = int(gib * (1 << 30)) // 4
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.empty_like(src)
    copy = _rates(2 * src.nbytes / 1e9, _timed(lambda: dst.copy_(src), repeats))
    read = _rates(src.nbytes / 1e9, _timed(lambda: src.sum(), repeats))
    return {"threads": threads, "array_gib": gib, "copy_gb_s": copy, "read_gb_s": read}


def matmul_flops(threads: int, tokens: int = 512, k: int = 1536, n: int = 8960,
                 repeats: int = 3) -> dict[str, Any]:
    """GFLOP/s of ``(tokens x k) @ (k x n)`` in float32 and bfloat16 (the 1.5B's MLP up-projection)."""
    import torch

    torch.set_num_threads(threads)
    flop = 2 * tokens * k * n / 1e9
    out: dict[str, Any] = {"threads": threads, "shape": [tokens, k, n]}
    a, b = torch.randn(tokens, k), torch.randn(k, n)
    with torch.no_grad():
        out["float32_gflop_s"] = _rates(flop, _timed(lambda: a @ b, repeats))
    # bfloat16 the way vLLM's CPU linear layers run it (vllm/model_executor/layers/utils.py,
    # dispatch_cpu_unquantized_gemm): its oneDNN GEMM, else torch's linear where oneDNN refuses
    weight = torch.randn(n, k, dtype=torch.bfloat16)  # a linear layer's [out, in]
    x = a.to(torch.bfloat16)
    gemm: Callable[[], object] = lambda: torch.nn.functional.linear(x, weight)  # noqa: E731
    out["bfloat16_path"] = "torch.nn.functional.linear"
    try:
        from vllm import _custom_ops as ops

        if ops._supports_onednn:
            handler = ops.create_onednn_mm(weight.t(), 32)
            gemm, out["bfloat16_path"] = (lambda: ops.onednn_mm(handler, x, None)), "vllm onednn_mm"
    except (ImportError, RuntimeError) as err:  # no vLLM, or oneDNN has no bf16 matmul for this CPU
        out["bfloat16_path"] += f" ({type(err).__name__}: {str(err)[:60]})"
    with torch.no_grad():
        out["bfloat16_gflop_s"] = _rates(flop, _timed(gemm, repeats))
    # 4-bit weights, bfloat16 activations: vLLM's cpu_gemm_wna16 where its build has it, else the
    # PyTorch int4 kernel clawproxy's plugin falls back to (clawproxy/engine/vllm/int4_cpu.py)
    from clawproxy.engine.vllm.int4_cpu import int4_matmul, repack

    packed, scales_and_zeros = repack(torch.randint(0, 16, (n, k), dtype=torch.int32), torch.rand(n, k // 128) / 100,
                                      128, torch.bfloat16)
    with torch.no_grad():
        out["int4_torch_gflop_s"] = _rates(flop, _timed(lambda: int4_matmul(x, packed, scales_and_zeros, 128, n),
                                                        repeats))
    return out


def measure(threads: list[int], gib: float = 1.0, repeats: int = 5) -> dict[str, Any]:
    return {"cpus": len(os.sched_getaffinity(0)), "load_avg": os.getloadavg(),
            "memory": [memory_bandwidth(t, gib, repeats) for t in threads],
            "matmul": [matmul_flops(t) for t in threads]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1],
                    help="thread counts to measure (vLLM's auto binding gives it 1 of this machine's 2 CPUs)")
    ap.add_argument("--gib", type=float, default=1.0, help="array size in GiB (far above the caches)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    res = measure(args.threads, args.gib, args.repeats)
    for m in res["memory"]:
        print(f"memory, {m['threads']} thread(s): copy {m['copy_gb_s']['best']:.1f} GB/s "
              f"(median {m['copy_gb_s']['median']:.1f}), read {m['read_gb_s']['best']:.1f} GB/s "
              f"(median {m['read_gb_s']['median']:.1f})")
    for m in res["matmul"]:
        print(f"matmul {m['shape']}, {m['threads']} thread(s): float32 {m['float32_gflop_s']['best']:.0f} "
              f"GFLOP/s, bfloat16 {m['bfloat16_gflop_s']['best']:.0f} GFLOP/s ({m['bfloat16_path']}), "
              f"int4 weights (PyTorch) {m['int4_torch_gflop_s']['best']:.0f} GFLOP/s")
    print(f"load average {res['load_avg'][0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
