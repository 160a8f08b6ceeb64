"""Score voters on the labeled cases: accuracy, per-class precision/recall, FPR and FNR.

- false-positive rate: share of bad or neutral cases judged good (a false +1 rewards a bad answer)
- false-negative rate: share of good cases judged bad (a false -1 punishes a good answer)
- sign precision: of the cases scored +1 or -1, the share with the right sign (what training sees)
- coverage: of the cases whose gold label is +1 or -1, the share scored with that sign

Each case gets m votes, their majority and its confidence, exactly as the worker does it; a majority
less sure than the voter's threshold scores 0. ``Report.tradeoff`` replays other thresholds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from judge.eval.dataset import Case
from judge.voters import EmbeddingVoter, Vote, Voter, cast, combine

CLASSES = (1, 0, -1)
TRADEOFF_GRID = (0.0, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
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
    majority: list[int] = field(default_factory=list)  # each case's majority before the threshold
    confidence: list[float | None] = field(default_factory=list)  # and its confidence
    min_confidence: float = 0.0
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
        return fpr(self.gold, self.pred)

    @property
    def fnr(self) -> float:
        pos = [p for g, p in zip(self.gold, self.pred, strict=True) if g == 1]
        return sum(p == -1 for p in pos) / len(pos) if pos else 0.0

    @property
    def sign_precision(self) -> float | None:
        return sign_precision(self.gold, self.pred)

    @property
    def coverage(self) -> float:
        return coverage(self.gold, self.pred)

    def scored_at(self, threshold: float) -> list[int]:
        """The scores these votes get under another confidence threshold."""
        return [m if m != 0 and (c is None or c >= threshold) else 0
                for m, c in zip(self.majority, self.confidence, strict=True)]

    def tradeoff(self, thresholds: list[float]) -> list[dict[str, Any]]:
        """Per threshold: sign precision, coverage, accuracy, FPR and how many cases were scored."""
        rows = []
        for t in thresholds:
            pred = self.scored_at(t)
            rows.append({"threshold": t, "sign_precision": _r(sign_precision(self.gold, pred)),
                         "coverage": round(coverage(self.gold, pred), 4),
                         "accuracy": round(sum(g == p for g, p in zip(self.gold, pred, strict=True)) / max(self.n, 1), 4),
                         "fpr": round(fpr(self.gold, pred), 4), "scored": sum(p != 0 for p in pred)})
        return rows

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
            "sign_precision": _r(self.sign_precision), "coverage": round(self.coverage, 4),
            "min_confidence": self.min_confidence,
            "precision": {CLASS_NAME[c]: _r(self.precision(c)) for c in CLASSES},
            "recall": {CLASS_NAME[c]: _r(self.recall(c)) for c in CLASSES},
            "failed_votes": self.failed_votes, "total_votes": self.total_votes,
            "seconds": round(self.seconds, 2),
            "errors": [{"id": i, "gold": g, "pred": p} for i, g, p in self.errors()],
            "cases": [{"id": i, "gold": g, "votes": v, "majority": m, "confidence": c}
                      for i, g, v, m, c in zip(self.ids, self.gold, self.votes, self.majority,
                                               self.confidence, strict=True)],
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def sign_precision(gold: list[int], pred: list[int]) -> float | None:
    """Of the cases scored ±1, the share whose gold label is that score (None: none scored)."""
    scored = [(g, p) for g, p in zip(gold, pred, strict=True) if p != 0]
    return sum(g == p for g, p in scored) / len(scored) if scored else None


def coverage(gold: list[int], pred: list[int]) -> float:
    """Of the cases labeled ±1, the share scored with that sign."""
    signed = [(g, p) for g, p in zip(gold, pred, strict=True) if g != 0]
    return sum(g == p for g, p in signed) / len(signed) if signed else 0.0


def fpr(gold: list[int], pred: list[int]) -> float:
    neg = [p for g, p in zip(gold, pred, strict=True) if g != 1]
    return sum(p == 1 for p in neg) / len(neg) if neg else 0.0


def evaluate(voter: Voter, cases: list[Case], m: int, split: str, progress: Any = None,
             min_confidence: float | None = None) -> Report:
    """Run m votes per case, combined as the worker does (``min_confidence``: the voter's own
    threshold when None); ``progress(n)`` is called after each case."""
    threshold = voter.min_confidence if min_confidence is None else min_confidence
    report = Report(voter=voter.name, split=split, m=m, min_confidence=threshold)
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
        verdict = combine(votes, threshold)
        report.gold.append(case.score)
        report.pred.append(verdict.score)
        report.majority.append(verdict.majority)
        report.confidence.append(verdict.confidence)
        report.ids.append(case.id)
        if progress is not None:
            progress(1)
    report.seconds = time.perf_counter() - t0
    return report


def render(report: Report, console: Any, show_errors: bool = False) -> None:
    """Print one voter's figures as rich tables."""
    from rich.table import Table

    sp = report.sign_precision
    title = (f"voter={report.voter}  split={report.split}  n={report.n}  m={report.m}  "
             f"accuracy={report.accuracy:.3f}  FPR={report.fpr:.3f}  FNR={report.fnr:.3f}  "
             f"sign precision={'-' if sp is None else f'{sp:.3f}'}  coverage={report.coverage:.3f}  "
             f"(min confidence {report.min_confidence:g})")
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


def render_tradeoff(report: Report, console: Any) -> None:
    """Sign precision against coverage at each threshold of ``TRADEOFF_GRID`` (the voter's own marked)."""
    from rich.table import Table

    table = Table(title=f"{report.voter} on {report.split}: confidence threshold trade-off", title_justify="left")
    for col in ("min confidence", "sign precision", "coverage", "accuracy", "FPR", "scored"):
        table.add_column(col, justify="right")
    for row in report.tradeoff(sorted({*TRADEOFF_GRID, report.min_confidence})):
        mark = " *" if row["threshold"] == report.min_confidence else ""
        sp = row["sign_precision"]
        table.add_row(f"{row['threshold']:g}{mark}", "-" if sp is None else f"{sp:.3f}", f"{row['coverage']:.3f}",
                      f"{row['accuracy']:.3f}", f"{row['fpr']:.3f}", str(row["scored"]))
    console.print(table)
