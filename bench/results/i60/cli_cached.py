# ruff: noqa  (a record of how the figures were replayed from cached feature rows in /tmp, not a tool)
"""Run `clawproxy judge eval ...` with the embedding voter's feature rows looked up in the caches
made earlier by the same features() code (cases missing there are encoded as usual)."""
import sys

import numpy as np

import judge.voters as V
from judge.embedding import features
from judge.eval.dataset import load_cases
from judge.eval.uss import FIT_SOURCES, load_uss

rows = {}
d = np.load("/tmp/i60-features.npz")
byid = {i: x for i, x in zip(d["id"].tolist(), d["x"])}
from pathlib import Path

for split in ("train", "validation", "test"):
    for cs in load_uss(Path("/tmp/uss"), FIT_SOURCES, split).values():
        for c in cs:
            if c.id in byid:
                rows[(c.inp.request, c.inp.response, c.inp.next_state)] = byid[c.id]
w = np.load("/tmp/i60-written.npz")
for split in ("train", "validation", "registers"):
    cases = [c for c in load_cases(split) if c.inp.role == "user"]
    for c, x in zip(cases, w[f"x_{split}"]):
        rows[(c.inp.request, c.inp.response, c.inp.next_state)] = x
def precompute(self, inputs):
    keys = [(i.request, i.response, i.next_state) for i in inputs]
    miss = [i for i, k in zip(inputs, keys) if k not in rows]
    if miss:
        for i, x in zip(miss, features(miss)):
            rows[(i.request, i.response, i.next_state)] = x
    print(f"[cached features: {len(inputs) - len(miss)} of {len(inputs)}]", file=sys.stderr)
    return np.stack([rows[k] for k in keys])
V.EmbeddingVoter.precompute = precompute
from clawproxy.cli import main

sys.argv[0] = "clawproxy"
main()
