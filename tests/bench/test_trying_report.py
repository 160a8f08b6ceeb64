"""bench/trying_report.py on two small curve files written as `clawproxy simulate` writes them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from clawproxy.simulate.measure import Curve, make_point, write_json

ROOT = Path(__file__).resolve().parents[2]


def _curve(tmp: Path, seed: int, found_at: int | None, adoption_36: float) -> Path:
    c = Curve(label="x", persona="concise", method="combined", settings={"seed": seed})
    c.points = [make_point(0, [], None, 0.0), make_point(36, [], None, 1.0)]
    c.points[1].adoption = adoption_36
    c.samples = {"trained:opd": 5, "skipped:score_0": 2}
    c.trying = {"served_adoption": 0.7, "served_adoption_after_found": 0.9, "found_at": found_at,
                "tried_share": 0.3, "tried_share_after_found": 0.05,
                "judge_on_tried": {"right": 4, "zero": 6, "wrong": 1, "unjudged": 0},
                "real_answer_share": {"tried": 1.0, "untried": 0.9},
                "preferences": [{"text": "Be brief.", "status": "active", "good": 3, "bad": 0}],
                "steps": [{"kl_behaviour": 0.2, "clip_frac": 0.1}, {"kl_behaviour": 0.4, "clip_frac": 0.3}]}
    c.peers = {"effort": [10, 6, 2 + seed], "streak_at": 19 if found_at else None, "told": 1.0,
               "capability": {"tasks": 8, "base": 7, "final": 6}}
    return write_json(tmp / f"s{seed}" / "out" / "curve.json", [c])


def test_per_seed_rows_then_the_mean_and_spread(tmp_path):
    paths = [_curve(tmp_path, 0, 9, 0.8), _curve(tmp_path, 1, None, 0.4)]
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "trying_report.py"), *map(str, paths)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 5
    assert "seed 0" in lines[0] and "found at 9" in lines[0] and "judge on tried 4/6/1" in lines[0]
    assert "kl_behaviour 0.200-0.400" in lines[0] and "trained 5" in lines[0] and "Be brief." in lines[0]
    assert "effort [10, 6, 2]" in lines[1] and "streak from 19" in lines[1] and "capability 7 -> 6 of 8" in lines[1]
    assert "found at -" in lines[2] and "streak from -" in lines[3]
    assert "36: 0.60 (sd 0.28, n 2)" in lines[4] and "found by 12 in 1 of 2" in lines[4]
    assert "effort last/first 0.25 (sd 0.07, n 2)" in lines[4] and "streak by 24 in 1 of 2" in lines[4]
