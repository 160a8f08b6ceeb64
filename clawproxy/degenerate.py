"""Looping and broken generations: one module for the recorder, the trainer, the gate and the simulator.

The measures are shared (``gram_share``, the run and window checks). Four questions use them, each
with its own thresholds because each asks something different, and each named for what it asks;
only the first is called "degenerate":

- ``is_degenerate(text)``: a loop bad enough that training on it blows up gradient norms. The
  recorder (``clawproxy/proxy/sessions.py``) marks such a turn ``degenerate``.
- ``ids_loop(ids)``: a loop in token ids. The trainer's batch filter (``trainer/batch.py``) asks it
  of the recorded completion ids, which the text check never sees (its skip reason is also
  ``degenerate``).
- ``canary_broken(ids, stop_ids, decode)``: the publish gate's question about a greedy canary
  answer: empty, a handful of tokens over and over, ``ids_loop``, or ``is_degenerate`` text.
- ``answer_flaw(text)``: why a person would not accept an answer (empty, a word or two, symbols,
  a word repeated, a phrase looped, too few distinct words), or None. Stricter than
  ``is_degenerate``: the simulator (``clawproxy/simulate``) grades answers with it.

Pure Python, no torch: the proxy imports it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from typing import Any

_WORD = re.compile(r"[A-Za-z0-9']+")
_WS = re.compile(r"\s+")

MIN_WORDS = 3


def words(text: str) -> list[str]:
    """Words as a person counts them (whitespace-separated tokens with a letter or digit)."""
    return [w for w in text.split() if _WORD.search(w)]


def gram_share(seq: Sequence[Any]) -> float:
    """Distinct 3-grams over all 3-grams of ``seq`` (words or token ids): low means it loops."""
    grams = [tuple(seq[i : i + 3]) for i in range(len(seq) - 2)]
    return len(set(grams)) / len(grams) if grams else 1.0


def _chars_loop(text: str) -> bool:
    """A run of characters repeated without spaces ("hahaha..."), which has no words to count."""
    stripped = _WS.sub("", text)
    if len(stripped) < 200:
        return False
    windows = {stripped[i : i + 8] for i in range(0, len(stripped) - 8, 4)}
    return len(windows) / ((len(stripped) - 8) // 4 + 1) < 0.1


def is_degenerate(text: str) -> bool:
    """True when the text loops badly enough that it must not be trained on: under 30% distinct
    word 3-grams over 40+ words, or a character loop. Empty text is not a loop (a tool call)."""
    ws = text.split()
    return (len(ws) >= 40 and gram_share(ws) < 0.3) or _chars_loop(text)


def answer_flaw(text: str) -> str | None:
    """Why ``text`` is not a real answer, or None when it reads like language.

    Catches what small models do when pushed too hard: empty output, a phrase looped over and over,
    a single token repeated, or runs of symbols instead of words. Stricter than ``is_degenerate``:
    a person calls an answer broken well before it is unsafe to train on.
    """
    stripped = text.strip()
    if not stripped:
        return "empty"
    ws = [w.lower().strip(".,!?;:*-\"'()") for w in words(stripped)]
    ws = [w for w in ws if w]
    if len(ws) < MIN_WORDS:
        return "too_short"
    letters = sum(c.isalpha() for c in stripped)
    if letters < 0.5 * len(stripped.replace(" ", "").replace("\n", "")):
        return "symbols"
    run = 1  # the same word more than 4 times in a row
    for a, b in zip(ws, ws[1:], strict=False):
        run = run + 1 if a == b else 1
        if run > 4:
            return "repeated_word"
    if len(ws) >= 12 and gram_share(ws) < 0.5:
        return "looping"
    if len(ws) >= 8 and len(set(ws)) / len(ws) < 0.3:
        return "low_vocabulary"
    return None


def ids_loop(ids: list[int]) -> bool:
    """True when a token sequence is stuck in a loop, judged on the ids themselves.

    Two checks: (1) somewhere one short pattern (period 1..32) repeats at least 4 times in a row over
    at least 24 tokens (``the the the ...``, ``ab ab ab ...``), even if the text escapes the loop at
    the end; (2) in 64+ tokens, fewer than 20% of the 3-grams are distinct (a loop with small
    variations). Normal text, code and lists pass both.
    """
    n = len(ids)
    for period in range(1, 33):
        if n < 2 * period:
            break
        run = 0
        for i in range(period, n):
            run = run + 1 if ids[i] == ids[i - period] else 0
            if run + period >= max(24, 4 * period):
                return True
    return n >= 64 and gram_share(ids) < 0.2


def canary_broken(ids: list[int], stop_ids: Collection[int], decode: Callable[[list[int]], str] | None = None) -> bool:
    """A generated answer (ids, stop tokens included) is broken: nothing, a handful of tokens
    over and over, a loop of ids, or, with ``decode``, text that loops with small variations that
    exact-id repeats miss."""
    text_ids = [t for t in ids if t not in stop_ids]
    if not text_ids:
        return True
    if len(text_ids) >= 12 and len(set(text_ids)) <= max(2, len(text_ids) // 6):
        return True
    if ids_loop(text_ids):
        return True
    return decode is not None and is_degenerate(decode(text_ids))
