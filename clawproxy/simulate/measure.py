"""Measurement: held-out adoption against interactions, as JSON, a PNG plot and a live table.

Every K interactions the currently served model answers the held-out prompts (greedy, so the
answers depend on the weights only). An answer is *adopted* when it meets the persona's preference
and is a real answer (non-empty, not degenerate, on topic; see ``quality``). The degenerate share is
reported beside it: shorter gibberish is reward hacking, not personalization.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawproxy.degenerate import words
from clawproxy.simulate.quality import ON_TOPIC_MIN, assess


@dataclass
class EvalAnswer:
    prompt: str
    answer: str
    words: int
    met: bool
    degenerate: str | None
    similarity: float
    adopted: bool
    cut_off: bool = False  # the token limit ended it: never adopted, whatever the check says


@dataclass
class CurvePoint:
    """One measurement pass."""

    interactions: int
    adoption: float  # met AND real answer AND not cut off by the token limit
    preference_rate: float  # met, whatever the quality
    degenerate_share: float
    off_topic_share: float
    mean_words: float
    mean_similarity: float
    weight_version: int | None
    judge_score_mean: float | None = None  # mean judge score of the turns since the last point
    judged: int = 0
    elapsed_s: float = 0.0
    cut_off_share: float = 0.0  # answers the token limit ended (counted as not adopted)
    answers: list[EvalAnswer] = field(default_factory=list)
    served_by: str | None = None  # the model name measured (several users: whose adapter)
    # several users: another persona's adoption on these same answers (compare Curve.cross_baseline)
    cross_talk: dict[str, float] = field(default_factory=dict)


@dataclass
class Curve:
    """A run's adoption curve plus what produced it."""

    label: str
    persona: str
    method: str
    settings: dict[str, Any] = field(default_factory=dict)
    points: list[CurvePoint] = field(default_factory=list)
    wall_s: float = 0.0
    # the judge against the simulator's intended verdicts: right / zero / wrong sign / unjudged
    judge_agreement: dict[str, int] = field(default_factory=dict)
    # what became of each interaction: trained, or why not (see StoreView.sample_accounting)
    samples: dict[str, int] = field(default_factory=dict)
    user: str | None = None  # several users: whose curve this is
    # several users: each other persona's adoption on the base model's answers at point 0
    cross_baseline: dict[str, float] = field(default_factory=dict)
    trained: int | None = None  # several users: turns this user's own adapter trained on
    # learning by trying: what was tried and found (StoreView.trying_report)
    trying: dict[str, Any] = field(default_factory=dict)
    # as peers measure it (simulate/peers.py): effort, streak_at, capability, told
    peers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Curve:
        points = [
            CurvePoint(**{**p, "answers": [EvalAnswer(**a) for a in p.get("answers", [])]})
            for p in data.get("points", [])
        ]
        return cls(**{**data, "points": points})

    def adoption_at(self, interactions: int) -> float | None:
        """Adoption at the last point taken at or before ``interactions``."""
        best = None
        for p in self.points:
            if p.interactions <= interactions:
                best = p.adoption
        return best


def score_answers(prompts: Sequence[str], answers: Sequence[str], check: Any,
                  on_topic_min: float = ON_TOPIC_MIN, cut_off: Sequence[bool] | None = None) -> list[EvalAnswer]:
    """Grade held-out answers against a preference check and the real-answer checks; an answer the
    token limit cut off (``cut_off[i]``) is not adopted: half an answer is not a short answer."""
    quality = assess(list(prompts), list(answers), on_topic_min)
    cuts = list(cut_off) if cut_off is not None else [False] * len(answers)
    out = []
    for p, a, q, cut in zip(prompts, answers, quality, cuts, strict=True):
        met = bool(check(a))
        out.append(EvalAnswer(p, a, len(words(a)), met, q.degenerate, round(q.similarity, 4),
                              met and q.real and not cut, bool(cut)))
    return out


def adoption_with(graded: Sequence[EvalAnswer], check: Any, on_topic_min: float = ON_TOPIC_MIN) -> float:
    """Adoption of graded answers under another preference's check (their quality is already known)."""
    hits = [bool(check(g.answer)) and g.degenerate is None and g.similarity >= on_topic_min and not g.cut_off
            for g in graded]
    return sum(hits) / max(len(hits), 1)


def make_point(interactions: int, graded: list[EvalAnswer], weight_version: int | None,
               elapsed_s: float, on_topic_min: float = ON_TOPIC_MIN,
               judge_score_mean: float | None = None, judged: int = 0) -> CurvePoint:
    n = max(len(graded), 1)
    return CurvePoint(
        interactions=interactions,
        adoption=sum(g.adopted for g in graded) / n,
        preference_rate=sum(g.met for g in graded) / n,
        degenerate_share=sum(g.degenerate is not None for g in graded) / n,
        off_topic_share=sum(g.similarity < on_topic_min for g in graded) / n,
        mean_words=statistics.fmean([g.words for g in graded]) if graded else 0.0,
        mean_similarity=statistics.fmean([g.similarity for g in graded]) if graded else 0.0,
        weight_version=weight_version,
        judge_score_mean=judge_score_mean,
        judged=judged,
        elapsed_s=round(elapsed_s, 1),
        cut_off_share=sum(g.cut_off for g in graded) / n,
        answers=graded,
    )


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, curves: Sequence[Curve], extra: dict[str, Any] | None = None) -> Path:
    """Write curves (and anything in ``extra``) as one JSON document, atomically."""
    doc = {"written_at": time.time(), "curves": [c.to_dict() for c in curves], **(extra or {})}
    p = Path(path)
    atomic_write(p, json.dumps(doc, indent=1).encode())
    return p


def read_json(path: str | os.PathLike) -> list[Curve]:
    doc = json.loads(Path(path).read_text())
    return [Curve.from_dict(c) for c in doc["curves"]]


def adoption_curves(data_path: str | os.PathLike, user: str | None = None) -> list[dict[str, Any]]:
    """The held-out adoption curve(s) `clawproxy simulate` left in a data dir (``simulate/curve.json``),
    as label and points (x interactions, y adoption), for `clawproxy stats` and the dashboard alike;
    with ``user``, that user's curve only; empty when there is no readable file."""
    path = Path(data_path) / "simulate" / "curve.json"
    if not path.exists():
        return []
    try:
        curves = read_json(path)
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [{"label": c.label or c.persona, "points": [{"x": p.interactions, "y": p.adoption} for p in c.points]}
            for c in curves if user is None or c.user == user]


def plot_png(path: str | os.PathLike, curves: Sequence[Curve], title: str | None = None) -> Path:
    """Adoption (solid) and degenerate share (dotted) against interactions, one colour per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    many = len(curves) > 3  # the legend goes beside the axes instead of over the lines
    fig, ax = plt.subplots(figsize=(11 if many else 7, 4.2), dpi=110)
    for i, c in enumerate(curves):
        color = f"C{i}"
        xs = [p.interactions for p in c.points]
        ax.plot(xs, [p.adoption for p in c.points], "-o", color=color, label=f"{c.label}: adoption")
        if any(p.degenerate_share for p in c.points):
            ax.plot(xs, [p.degenerate_share for p in c.points], ":", color=color,
                    label=f"{c.label}: degenerate")
    ax.set_xlabel("interactions (assistant turns with user feedback)")
    ax.set_ylabel("held-out share")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if many:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=7, loc="best")
    ax.set_title(title or "Held-out preference adoption", fontsize=10)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, p)
    return p


def point_row(label: str, p: CurvePoint) -> list[str]:
    js = "-" if p.judge_score_mean is None else f"{p.judge_score_mean:+.2f} ({p.judged})"
    wv = "-" if p.weight_version is None else str(p.weight_version)
    return [label, str(p.interactions), f"{p.adoption:.2f}", f"{p.preference_rate:.2f}",
            f"{p.degenerate_share:.2f}", f"{p.cut_off_share:.2f}", f"{p.mean_words:.0f}", f"{p.mean_similarity:.2f}", js, wv,
            f"{p.elapsed_s:.0f}"]


COLUMNS = ("run", "inter.", "adoption", "pref met", "degen.", "cut off", "words", "sim", "judge", "weights", "t (s)")


class LiveTable:
    """Prints one rich table row per measurement as it comes (plain lines when not a TTY)."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console

        # rich wraps at 80 columns when not on a terminal: a log file would lose the last columns
        self.console = console or Console(width=None if sys.stdout.isatty() else 160)
        self._header_done = False

    def add(self, label: str, point: CurvePoint) -> None:
        from rich.table import Table

        table = Table(show_header=not self._header_done, box=None, pad_edge=False)
        for col in COLUMNS:
            table.add_column(col, justify="right" if col != "run" else "left", no_wrap=True,
                             min_width=max(len(col), 30 if col == "run" else 6))
        table.add_row(*point_row(label, point))
        self.console.print(table)
        self._header_done = True

    def summary(self, curves: Sequence[Curve]) -> None:
        from rich.table import Table

        table = Table(title="held-out adoption by interactions")
        for col in COLUMNS:
            table.add_column(col, justify="right" if col != "run" else "left", no_wrap=True)
        for c in curves:
            for p in c.points:
                table.add_row(*point_row(c.label, p))
        self.console.print(table)
