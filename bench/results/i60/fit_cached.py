"""Run judge.eval.fit.main with the feature rows cached earlier from the same code (the machine's
two cores are shared; the encoder pass is the slow part). Same cases, same order, same rows."""

import numpy as np

import judge.eval.fit as fit
from judge.eval.dataset import LABEL_SCORE, load_cases
from judge.eval.uss import FIT_SOURCES, load_uss

w = np.load("/tmp/i60-written.npz")
d = np.load("/tmp/i60-features.npz")
def user_cases(split):
    cases = [c for c in load_cases(split) if c.inp.role == "user"]
    y = np.array([LABEL_SCORE[c.label] + 1 for c in cases])
    assert (y == w[f"y_{split}"]).all()
    return cases, w[f"x_{split}"], y
def uss_cases(directory, split):
    cases = [c for cs in load_uss(directory, FIT_SOURCES, split).values() for c in cs if c.label != "neutral"]
    m = (d["split"] == split) & (d["y"] != 0)
    assert [c.id for c in cases] == d["id"][m].tolist()
    return cases, d["x"][m], np.array([LABEL_SCORE[c.label] + 1 for c in cases])
fit.user_cases, fit.uss_cases = user_cases, uss_cases
fit.main(["--uss", "/tmp/uss"])
