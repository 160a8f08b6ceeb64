"""Which confidence lets the embedding voter abstain best? Measured on validation, over head seeds.

For each seed the head is fitted on the TRAIN split with the settings ``judge.eval.fit`` chooses on
validation (C and the class thresholds, m=3 bagged votes), and the threshold a ±1 majority needs is
the fit's rule on a finer grid (``GRID``: a support lowers the confidence): the lowest whose
validation sign precision reaches 0.95, else the most precise with coverage >= 0.6. Four
confidences are compared, each the votes' mean probability of the majority times a support
(``support``):

- ``probability``: no support (embedding v6, shipped with min_confidence 0.8);
- ``cues``: 0 for a sign the explicit cues contradict, and for both signs when the answer asked the
  user a question and the reply has no cue;
- ``neighbours``: the square root of the share of the 10 train replies nearest the reply (by its
  embedding) whose label is the majority;
- ``both``: the two together (tried as embedding v7 in bench/results/i35/README.md; not shipped).

Printed per confidence: the chosen threshold, sign precision / coverage on all of validation and on
each of its sources (va composed from the train pools' unused entries, vh hand-written, vq composed
react-then-ask), and the sign precision of the +1 and of the -1 verdicts; mean and sd over seeds.
The held-out split is never read.

    .venv/bin/python bench/judge_abstain.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from _env import ROOT  # noqa: F401  (sets up the environment)

from judge.embedding import FEATURE_NAMES, fit_head
from judge.eval.fit import (
    MIN_COVERAGE,
    SIGN_PRECISION,
    K,
    choose_settings,
    sign_figures,
    user_cases,
    vote_majority,
)
from judge.extract import JudgeInput
from judge.lexical import cues, lexical_score

CONFIDENCES = ("probability", "cues", "neighbours", "both")
GRID = tuple(round(0.3 + 0.025 * i, 3) for i in range(27))  # 0.3 .. 0.95
KNN = 10
# validation's sources by id prefix: composed from the train pools' unused entries (va), hand-written
# (vh), composed react-then-ask (vq); the composed ones sit close to train, vh shows replies unlike them
SOURCES = ("va", "vh", "vq")


def source_of(case_id: str) -> str:
    if case_id[:2] not in SOURCES:
        raise ValueError(f"validation case {case_id}: its id names no source of {SOURCES}")
    return case_id[:2]


def neighbour_shares(train_emb: np.ndarray, train_y: np.ndarray, emb: np.ndarray, k: int = KNN) -> np.ndarray:
    """(rows, 3): each class's share (0 bad, 1 neutral, 2 good) of the k train replies most similar
    to each reply (unit-norm embeddings)."""
    near = np.argsort(-(emb @ train_emb.T), axis=1, kind="stable")[:, :k]
    return np.stack([(train_y[near] == c).mean(axis=1) for c in range(3)], axis=1)


def support(shares: np.ndarray, inp: JudgeInput) -> np.ndarray:
    """Per class (bad, neutral, good), in [0, 1]: the square root of the neighbours' share; 0 for a
    sign the explicit cues contradict; 0 for both signs when the answer asked the user something and
    the reply has no cue (it answers the question: neutral by the labeling convention, and the train
    split has almost no such turns)."""
    s = np.sqrt(np.asarray(shares, dtype=np.float64))
    lex = lexical_score(cues(inp.next_state, inp.request))
    if lex:
        s[1 - lex] = 0.0  # the opposite sign's index
    elif inp.response.rstrip().endswith("?"):
        s[[0, 2]] = 0.0
    return s


def choose_threshold(maj: np.ndarray, conf: np.ndarray, gold: np.ndarray) -> float:
    """judge.eval.fit's rule, on ``GRID``."""
    for t in GRID:
        if sign_figures(maj, conf, gold, t)[0] >= SIGN_PRECISION:
            return t
    keep = [t for t in GRID if sign_figures(maj, conf, gold, t)[1] >= MIN_COVERAGE]
    return max(keep or [GRID[0]], key=lambda t: sign_figures(maj, conf, gold, t)[0])


def sign_precision_of(maj: np.ndarray, conf: np.ndarray, gold: np.ndarray, t: float, sign: int) -> float:
    """Of the verdicts scored ``sign`` at threshold ``t``, the share with that gold sign."""
    scored = (maj == sign) & (conf >= t)
    return float((gold[scored] == sign).mean()) if scored.any() else float("nan")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = p.parse_args(argv)
    _, x_tr, y_tr = user_cases("train")
    val, x_va, y_va = user_cases("validation")
    gold = y_va - 1
    source = np.array([source_of(c.id) for c in val])
    dim = x_tr.shape[1] - len(FEATURE_NAMES)  # the reply embedding leads each feature row
    # float16 train embeddings, as the v7 head stored them (1315 x 384 in the head file)
    shares = neighbour_shares(x_tr[:, :dim].astype(np.float16).astype(np.float32), y_tr, x_va[:, :dim])
    supports = {
        "probability": np.ones((len(val), 3)),
        "cues": np.stack([support(np.ones(3), case.inp) for case in val]),
        "neighbours": np.sqrt(shares),
        "both": np.stack([support(s, case.inp) for s, case in zip(shares, val, strict=True)]),
    }
    rows: dict[str, list[list[float]]] = {name: [] for name in CONFIDENCES}
    for seed in args.seeds:
        c, tg, tb, *_ = choose_settings(x_tr, y_tr, x_va, y_va, seed, echo=False)
        head = fit_head(x_tr, y_tr, k=K, c=c, seed=seed, good_threshold=tg, bad_threshold=tb)
        maj = vote_majority(head, x_va) - 1
        probs = np.stack([head.probs(x_va, i % head.k) for i in range(3)])
        at = np.arange(len(val))
        print(f"seed {seed}: C={c} good>={tg} bad>={tb}")
        for name, sup in supports.items():
            conf = np.where(maj != 0, probs[:, at, maj + 1].mean(axis=0) * sup[at, maj + 1], 0.0)
            t = choose_threshold(maj, conf, gold)
            row = [t, *sign_figures(maj, conf, gold, t)]
            for s in SOURCES:
                row += sign_figures(maj[source == s], conf[source == s], gold[source == s], t)
            row += [sign_precision_of(maj, conf, gold, t, 1), sign_precision_of(maj, conf, gold, t, -1)]
            rows[name].append(row)
            print(f"  {name:12s} t={t:<6} all {row[1]:.3f}/{row[2]:.3f}  "
                  + "  ".join(f"{s} {row[3 + 2 * i]:.3f}/{row[4 + 2 * i]:.3f}" for i, s in enumerate(SOURCES))
                  + f"  +1 {row[-2]:.3f}  -1 {row[-1]:.3f}")
    print(f"\nmean (sd) over seeds {args.seeds}; sign precision / coverage")
    print("| confidence | threshold | validation | " + " | ".join(SOURCES) + " | precision of +1 / -1 verdicts |")
    print("|---|---|---|" + "---|" * len(SOURCES) + "---|")
    for name, r in rows.items():
        a = np.array(r)
        m, sd = a.mean(axis=0), a.std(axis=0)

        def pair(i: int, m: np.ndarray = m, sd: np.ndarray = sd) -> str:
            return f"{m[i]:.3f} ({sd[i]:.3f}) / {m[i + 1]:.3f} ({sd[i + 1]:.3f})"

        print(f"| {name} | {m[0]:.3f} ({sd[0]:.3f}) | {pair(1)} | "
              + " | ".join(pair(3 + 2 * i) for i in range(len(SOURCES)))
              + f" | {m[-2]:.3f} / {m[-1]:.3f} |")
    return {name: np.array(r).mean(axis=0).tolist() for name, r in rows.items()}


if __name__ == "__main__":
    main()
