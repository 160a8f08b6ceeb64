"""bench/gpu_check.py: the shapes really are Qwen2.5-Coder-1.5B's, and the real train_step runs
end to end on CPU with a tiny config (packed, the teacher pass run, every LoRA tensor moved)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.bench.util import bench_module

ROOT = Path(__file__).resolve().parents[2]


def test_config_has_the_default_models_parameter_count():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    mod = bench_module("gpu_check")
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**mod.QWEN25_CODER_1_5B))
    n = sum(p.numel() for p in model.parameters())
    assert 1.54e9 < n < 1.55e9, n  # Qwen2.5-Coder-1.5B: 1.54B with tied embeddings


def test_tiny_run_trains_a_packed_batch_with_the_teacher_pass(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--tiny", "--device", "cpu",
                           "--steps", "2", "--warmup", "0", "--completion-tokens", "8"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    assert r["dtype"] == "bfloat16" and r["step_s"] > 0 and r["tokens_per_s"] > 0 and r["peak_memory_gib"] > 0
    assert min(r["prompt_tokens"]) > 3000 and len(r["prompt_tokens"]) == 4  # OpenClaw-length, trainer.batch_size
    assert r["packed"] and r["forwarded_tokens"] < r["tokens"] / 2  # the shared system prompt computed once
    assert r["opd_samples"] == 2  # the two hinted samples had their teacher pass
    assert 0 < r["trainable"] < r["params"] / 5  # a LoRA adapter, not the whole model
    assert r["params_moved"] == r["trainable_tensors"]  # after 2 steps every LoRA A and B moved
