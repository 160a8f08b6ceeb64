"""bench/gpu_check.py: the Qwen3-4B shapes really are Qwen3-4B's, and the script runs end to end
(on CPU with --tiny; the GPU figures need a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.bench.util import bench_module

ROOT = Path(__file__).resolve().parents[2]


def test_config_has_qwen3_4b_parameter_count():
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    mod = bench_module("gpu_check")
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**mod.QWEN3_4B))
    n = sum(p.numel() for p in model.parameters())
    assert 4.0e9 < n < 4.05e9, n  # Qwen3-4B: 4.02B with tied embeddings


def test_tiny_run_reports_both_modes():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--tiny", "--device", "cpu",
                           "--steps", "1", "--warmup", "0"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    runs = {r["mode"]: r for r in json.loads(proc.stdout)["runs"]}
    assert set(runs) == {"full", "lora"}
    assert all(r["loss_finite"] and r["tokens_per_s"] > 0 and r["peak_memory_gib"] > 0 for r in runs.values())
    assert runs["lora"]["trainable"] < runs["full"]["trainable"] == runs["full"]["params"]
