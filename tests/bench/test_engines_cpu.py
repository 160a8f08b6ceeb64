"""bench/engines_cpu.py on tiny inputs: the bundled 135M on llama.cpp in bfloat16, a few tokens."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_engines_cpu_measures_llamacpp_and_publishes_without_a_failed_request(tmp_path, default_model_dir):
    from clawproxy.engine.llamacpp import build as llamacpp_build

    llamacpp_build.build(echo=False)
    out = tmp_path / "engines.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "engines_cpu.py"), "--engines", "llamacpp-bf16",
                        "--model", "default", "--tokens", "8", "--prompt-tokens", "300", "--memory-gib", "0.05",
                        "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads(out.read_text())["engines"]["llamacpp-bf16"]
    assert row["decode_tok_s"] > 0 and row["ttft_s"] > 0 and 0 < row["of_bound"]
    assert row["logprob_gap_max"] < 0.1  # bfloat16 against the float32 forward pass
    assert row["publish"]["failed"] == 0 and row["publish"]["requests"] > 0
    assert row["publish"]["script_convert_s"] > 0
    assert row["publish"]["served_by_v1"] > 0  # a request naming the published adapter got it
