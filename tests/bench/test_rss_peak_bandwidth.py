"""bench/rss_peak.py and bench/bandwidth.py run on tiny inputs: a group that holds a known
allocation, and a 16 MiB array."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rss_peak_sees_a_process_that_holds_memory(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; b = bytearray(200 << 20); "
                               "print('held', flush=True); time.sleep(60)  # rss-peak-probe"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        out = tmp_path / "peak.json"
        r = subprocess.run([sys.executable, str(ROOT / "bench" / "rss_peak.py"), "--group", "probe=rss-peak-probe",
                            "--interval", "0.05", "--seconds", "0.3", "--out", str(out)],
                           capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 0, r.stderr
    line = json.loads(out.read_text())
    assert line == json.loads(r.stdout.strip().splitlines()[-1])
    assert 0.2 <= line["peak_gb"]["probe"] < 1.0  # the 200 MiB it holds, and not the whole machine
    assert line["together_peak_gb"] == line["peak_gb"]["probe"]


def test_bandwidth_reports_positive_bounds_on_a_small_array(tmp_path):
    out = tmp_path / "bw.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bandwidth.py"), "--gib", "0.016", "--repeats", "1",
                        "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures and all(v > 0 for v in _floats(figures))


def _floats(d: object) -> list[float]:
    if isinstance(d, dict):
        return [f for v in d.values() for f in _floats(v)]
    if isinstance(d, list):
        return [f for v in d for f in _floats(v)]
    return [float(d)] if isinstance(d, (int, float)) and not isinstance(d, bool) else []
