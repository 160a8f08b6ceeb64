"""Seconds per vote of the default voter, one turn at a time as the worker casts them.

PYTHONPATH=. python bench/results/i60/vote_seconds.py [N]
Each turn: m=3 votes; the first computes the features (one encoder pass over reply, request and
answer), the other two reuse them. The turns are the registers split's (written, in the repository).
"""

from __future__ import annotations

import statistics
import sys
import time

from judge.eval.dataset import load_cases
from judge.voters import EmbeddingVoter, cast

n = int(sys.argv[1]) if len(sys.argv) > 1 else 60
voter = EmbeddingVoter()
cases = [c for c in load_cases("registers") if c.inp.role == "user"][:n]
cast(voter, cases[0].inp, 3)  # warm up
per_turn = []
for c in cases:
    t0 = time.perf_counter()
    cast(voter, c.inp, 3)
    per_turn.append(time.perf_counter() - t0)
per_turn.sort()
print(f"{len(per_turn)} turns x 3 votes: per turn median {statistics.median(per_turn) * 1000:.1f} ms, "
      f"p90 {per_turn[int(0.9 * len(per_turn))] * 1000:.1f} ms; per vote (turn / 3) median "
      f"{statistics.median(per_turn) / 3 * 1000:.1f} ms; first vote of a turn (all the encoding) at most "
      f"{per_turn[-1] * 1000:.1f} ms")
