"""Run `clawproxy judge eval ...` with the embedding voter's feature rows looked up in the caches
made by cache.py and the written splits' rows (the same features() code); cases missing there are
encoded as usual. Kept as run for issue 60: README.md says why.

PYTHONPATH=. python bench/results/i60/cli_cached.py judge eval --uss /tmp/uss/dataset
"""

import sys
from pathlib import Path

import numpy as np

import judge.voters as voters
from clawproxy.cli import main
from judge.embedding import features
from judge.eval.dataset import load_cases
from judge.eval.uss import FIT_SOURCES, load_uss

rows = {}
d = np.load("/tmp/i60-features.npz")
byid = dict(zip(d["id"].tolist(), d["x"], strict=True))
for split in ("train", "validation", "test"):
    for cs in load_uss(Path("/tmp/uss"), FIT_SOURCES, split).values():
        for c in cs:
            if c.id in byid:
                rows[(c.inp.request, c.inp.response, c.inp.next_state)] = byid[c.id]
w = np.load("/tmp/i60-written.npz")
for split in ("train", "validation", "registers"):
    cases = [c for c in load_cases(split) if c.inp.role == "user"]
    for c, x in zip(cases, w[f"x_{split}"], strict=True):
        rows[(c.inp.request, c.inp.response, c.inp.next_state)] = x


def precompute(self, inputs):
    keys = [(i.request, i.response, i.next_state) for i in inputs]
    miss = [i for i, k in zip(inputs, keys, strict=True) if k not in rows]
    if miss:
        for i, x in zip(miss, features(miss), strict=True):
            rows[(i.request, i.response, i.next_state)] = x
    print(f"[cached features: {len(inputs) - len(miss)} of {len(inputs)}]", file=sys.stderr)
    return np.stack([rows[k] for k in keys])


voters.EmbeddingVoter.precompute = precompute
sys.argv[0] = "clawproxy"
main()
