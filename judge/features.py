"""What an instruction changed: an answer's form as numbers, and whether tried answers moved.

A candidate instruction can only fix what a user complained about if the answers served under it
differ in form from the answers they complained about: "Write in flowing prose" on prose answers, or
"Avoid contractions" on answers that were too long, changes nothing the user can see, and a judge's
wrong sign must not make it a preference. So a candidate is promoted only when its answers *moved*
on some measurable feature of form, and, once the user has praised untried answers, moved towards
those (``moved``). The features are generic measures of form, the same for every user.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence

_LIST = re.compile(r"^\s*(?:[-*•+]|\d+[.)])\s+\S")
_HEADING = re.compile(r"^\s*(?:#{1,6}\s+\S|\*\*[^*]+\*\*:?\s*$|[A-Z][^.!?]{0,60}:\s*$)")
_FENCE = re.compile(r"^\s*```")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"[A-Za-z0-9']+")

# name -> the smallest spread that counts as a real difference (one unit of the feature)
FEATURES: dict[str, float] = {
    "log_words": 0.35,  # about x1.4 in length
    "sentences": 1.5,
    "lines": 1.5,
    "list_share": 0.25,  # the share of non-empty lines that are list items
    "headings": 1.0,
    "code_lines": 2.0,
    "exclamations": 1.0,
    "questions": 1.0,
    "first_sentence_words": 5.0,
    "last_line_words": 5.0,
}


def form(text: str) -> dict[str, float]:
    """The answer's form: length, sentences, lines, list and heading lines, code, punctuation, and
    the length of its opening sentence and closing line."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    sents = [s for s in _SENTENCE.split(text.strip()) if _WORD.search(s)]
    n_words = len(_WORD.findall(text))
    return {
        "log_words": math.log1p(n_words),
        "sentences": float(len(sents)),
        "lines": float(len(lines)),
        "list_share": sum(bool(_LIST.match(ln)) for ln in lines) / len(lines) if lines else 0.0,
        "headings": float(sum(bool(_HEADING.match(ln)) for ln in lines)),
        "code_lines": float(sum(bool(_FENCE.match(ln)) for ln in lines)),
        "exclamations": float(text.count("!")),
        "questions": float(text.count("?")),
        "first_sentence_words": float(len(_WORD.findall(sents[0]))) if sents else 0.0,
        "last_line_words": float(len(_WORD.findall(lines[-1]))) if lines else 0.0,
    }


def _mean(rows: Sequence[dict[str, float]], name: str) -> float:
    return statistics.fmean(r[name] for r in rows)


def movement(tried: Sequence[str], complained: Sequence[str], praised: Sequence[str] = ()) -> float:
    """How far the tried answers moved from the complained-about ones, in units of each feature's
    spread (the largest over the features). Where praised answers differ in form from the
    complained ones, only a move in the praised direction on those features counts; 0 when there is
    nothing to compare."""
    if not tried or not complained:
        return 0.0
    t, c = [form(x) for x in tried], [form(x) for x in complained]
    p = [form(x) for x in praised]
    undirected, directed = 0.0, []
    for name, unit in FEATURES.items():
        spread = max(unit, statistics.pstdev([r[name] for r in c]) if len(c) > 1 else 0.0)
        delta = (_mean(t, name) - _mean(c, name)) / spread
        undirected = max(undirected, abs(delta))
        towards = (_mean(p, name) - _mean(c, name)) / spread if p else 0.0
        if abs(towards) >= 1.0:  # praise and complaints differ here: only a move that way counts
            directed.append(delta if towards > 0 else -delta)
    return max(0.0, *directed) if directed else undirected


def moved(tried: Sequence[str], complained: Sequence[str], praised: Sequence[str] = (),
          threshold: float = 1.0) -> bool:
    """Whether the tried answers differ from the complained-about ones by at least ``threshold``
    spreads on some feature (in the praised direction when there is praise to point it)."""
    return movement(tried, complained, praised) >= threshold
