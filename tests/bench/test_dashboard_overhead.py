"""bench/dashboard_overhead.py runs end to end: both phases measured, the pollers really polled."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_closed_and_open_side_by_side():
    out = subprocess.run(
        [sys.executable, "bench/dashboard_overhead.py", "--rounds", "1", "--c1-requests", "3",
         "--paced-streams", "2", "--seed-turns", "40", "--tabs", "2", "--hz", "5",
         "--poll", "/metrics,/clawproxy/stats,/clawproxy/nothing-here"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"closed: C=1 unpaced added p50 -?[\d.]+ ms", out.stdout), out.stdout
    assert re.search(r"open  : C=1 unpaced added p50 -?[\d.]+ ms", out.stdout), out.stdout
    assert "not served, left out: /clawproxy/nothing-here" in out.stdout
    for url in ("/metrics", "/clawproxy/stats"):
        n = int(re.search(rf"poll {url}: (\d+) requests", out.stdout).group(1))
        assert n >= 2, out.stdout
