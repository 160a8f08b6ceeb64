"""Score voters on the labeled cases: accuracy, per-class precision/recall, FPR and FNR.

- false-positive rate: share of bad or neutral cases judged good (a false +1 rewards a bad answer)
- false-negative rate: share of good cases judged bad (a false -1 punishes a good answer)

Each case gets m votes and the majority, exactly as the worker does it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from judge.eval.dataset import Case
from judge.voters import EmbeddingVoter, Vote, Voter, cast, majority

CLASSES = (1, 0, -1)
CLASS_NAME = {1: "good", 0: "neutral", -1: "bad"}


@dataclass
class Report:
    voter: str
    split: str
    m: int
    gold: list[int] = field(default_factory=list)
    pred: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    votes: list[list[int | None]] = field(default_factory=list)  # each case's m scores
    failed_votes: int = 0
    total_votes: int = 0
    seconds: float = 0.0

    @property
    def n(self) -> int:
        return len(self.gold)

    @property
    def accuracy(self) -> float:
        return sum(g == p for g, p in zip(self.gold, self.pred, strict=True)) / max(self.n, 1)

    def precision(self, c: int) -> float | None:
        hits = [g for g, p in zip(self.gold, self.pred, strict=True) if p == c]
        return sum(g == c for g in hits) / len(hits) if hits else None

    def recall(self, c: int) -> float | None:
        hits = [p for g, p in zip(self.gold, self.pred, strict=True) if g == c]
        return sum(p == c for p in hits) / len(hits) if hits else None

    @property
    def fpr(self) -> float:
        neg = [p for g, p in zip(self.gold, self.pred, strict=True) if g != 1]
        return sum(p == 1 for p in neg) / len(neg) if neg else 0.0

    @property
    def fnr(self) -> float:
        pos = [p for g, p in zip(self.gold, self.pred, strict=True) if g == 1]
        return sum(p == -1 for p in pos) / len(pos) if pos else 0.0

    def confusion(self) -> dict[int, dict[int, int]]:
        out = {g: dict.fromkeys(CLASSES, 0) for g in CLASSES}
        for g, p in zip(self.gold, self.pred, strict=True):
            out[g][p] += 1
        return out

    def errors(self) -> list[tuple[str, int, int]]:
        return [(i, g, p) for i, g, p in zip(self.ids, self.gold, self.pred, strict=True) if g != p]

    def as_dict(self) -> dict[str, Any]:
        return {
            "voter": self.voter, "split": self.split, "m": self.m, "n": self.n,
            "accuracy": round(self.accuracy, 4), "fpr": round(self.fpr, 4), "fnr": round(self.fnr, 4),
            "precision": {CLASS_NAME[c]: _r(self.precision(c)) for c in CLASSES},
            "recall": {CLASS_NAME[c]: _r(self.recall(c)) for c in CLASSES},
            "failed_votes": self.failed_votes, "total_votes": self.total_votes,
            "seconds": round(self.seconds, 2),
            "errors": [{"id": i, "gold": g, "pred": p} for i, g, p in self.errors()],
            "cases": [{"id": i, "gold": g, "votes": v} for i, g, v in zip(self.ids, self.gold, self.votes, strict=True)],
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def evaluate(voter: Voter, cases: list[Case], m: int, split: str, progress: Any = None) -> Report:
    """Run m votes per case and the majority; ``progress(n)`` is called after each case."""
    report = Report(voter=voter.name, split=split, m=m)
    t0 = time.perf_counter()
    embedding = voter if isinstance(voter, EmbeddingVoter) else None  # votes from precomputed features
    feats = embedding.precompute([c.inp for c in cases]) if embedding is not None else None
    for i, case in enumerate(cases):
        try:
            if embedding is not None and feats is not None:
                votes = [embedding.vote_from_features(case.inp, feats[i], idx) for idx in range(m)]
            else:
                votes = cast(voter, case.inp, m)
        except Exception as e:  # a voter bug counts as failed votes, as in the worker
            votes = [Vote(None, error=f"{type(e).__name__}: {e}")] * m
        report.votes.append([v.score for v in votes])
        report.failed_votes += sum(v.score is None for v in votes)
        report.total_votes += len(votes)
        report.gold.append(case.score)
        report.pred.append(majority(votes))
        report.ids.append(case.id)
        if progress is not None:
            progress(1)
    report.seconds = time.perf_counter() - t0
    return report


def render(report: Report, console: Any, show_errors: bool = False) -> None:
    """Print one voter's figures as rich tables."""
    from rich.table import Table

    title = (f"voter={report.voter}  split={report.split}  n={report.n}  m={report.m}  "
             f"accuracy={report.accuracy:.3f}  FPR={report.fpr:.3f}  FNR={report.fnr:.3f}")
    table = Table(title=title, title_justify="left")
    table.add_column("class")
    table.add_column("precision", justify="right")
    table.add_column("recall", justify="right")
    table.add_column("support", justify="right")
    for c in CLASSES:
        p, r = report.precision(c), report.recall(c)
        table.add_row(CLASS_NAME[c], "-" if p is None else f"{p:.3f}", "-" if r is None else f"{r:.3f}",
                      str(sum(g == c for g in report.gold)))
    console.print(table)
    conf = report.confusion()
    cm = Table(title="confusion (rows: gold, columns: judged)", title_justify="left")
    cm.add_column("gold \\ judged")
    for c in CLASSES:
        cm.add_column(CLASS_NAME[c], justify="right")
    for g in CLASSES:
        cm.add_row(CLASS_NAME[g], *(str(conf[g][p]) for p in CLASSES))
    console.print(cm)
    console.print(
        f"accuracy {report.accuracy:.3f} | false-positive rate {report.fpr:.3f} (bad/neutral judged good) | "
        f"false-negative rate {report.fnr:.3f} (good judged bad) | failed votes "
        f"{report.failed_votes}/{report.total_votes} | {report.seconds:.1f}s"
    )
    if show_errors and report.errors():
        console.print("errors: " + ", ".join(f"{i} ({CLASS_NAME[g]}->{CLASS_NAME[p]})" for i, g, p in report.errors()))
