"""What a degenerate generation is: the one definition for the recorder, the trainer, the gate and the simulator.

A generation is degenerate when it loops: one word over and over, a phrase looped with small changes,
a few words cycled, or a run of characters repeated without spaces. Each caller asks the question it
needs and gets the same answer for the same text:

- the recorder (``clawproxy/proxy/sessions.py``) marks a turn ``degenerate`` when ``is_degenerate(text)``;
- the trainer (``trainer/batch.py``) checks the recorded completion ids with ``ids_loop``;
- the publish gate (``trainer/gate.py``) checks a canary answer with ``output_degenerate`` (both);
- the simulator (``clawproxy/simulate``) asks ``degeneracy(text)``, which also says when a text is
  not an answer at all (empty, a word or two, symbols instead of words).

Pure Python, no torch: the proxy imports it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

_WORD = re.compile(r"[A-Za-z0-9']+")
_WS = re.compile(r"\s+")

LOOPS = frozenset({"repeated_word", "looping", "low_vocabulary", "repeated_chars"})
"""``degeneracy`` reasons that mean the generation loops (the rest say it is not an answer)."""

MIN_WORDS = 3
GRAM_SHARE_MIN = 0.5  # fewer distinct word 3-grams than this share of all of them (12+ words) is a loop
VOCAB_WINDOW = 50  # distinct-word share is measured per window: long real texts reuse words
VOCAB_SHARE_MIN = 0.3


def words(text: str) -> list[str]:
    """Words as a person counts them (whitespace-separated tokens with a letter or digit)."""
    return [w for w in text.split() if _WORD.search(w)]


def _loop(text: str) -> str | None:
    ws = [w.lower().strip(".,!?;:*-\"'()") for w in words(text)]
    ws = [w for w in ws if w]
    run = 1
    for a, b in zip(ws, ws[1:], strict=False):
        run = run + 1 if a == b and not a.isdigit() else 1  # 0 0 0 0 0 is data, not a loop
        if run > 4:
            return "repeated_word"
    if len(ws) >= 12:
        grams = [tuple(ws[i : i + 3]) for i in range(len(ws) - 2)]
        if len(set(grams)) / len(grams) < GRAM_SHARE_MIN:
            return "looping"
    if len(ws) >= 8:
        step = VOCAB_WINDOW // 2
        for start in range(0, max(len(ws) - VOCAB_WINDOW, 0) + 1, step):
            window = ws[start : start + VOCAB_WINDOW]
            if len(set(window)) / len(window) < VOCAB_SHARE_MIN:
                return "low_vocabulary"
    stripped = _WS.sub("", text)
    if len(stripped) >= 200:  # a loop without spaces ("hahaha...") has no words to count
        windows = {stripped[i : i + 8] for i in range(0, len(stripped) - 8, 4)}
        if len(windows) / ((len(stripped) - 8) // 4 + 1) < 0.1:
            return "repeated_chars"
    return None


def degeneracy(text: str) -> str | None:
    """Why ``text`` is not a real answer (a ``LOOPS`` reason, or empty / too_short / symbols), or None."""
    stripped = text.strip()
    if not stripped:
        return "empty"
    if why := _loop(stripped):
        return why
    if len(words(stripped)) < MIN_WORDS:
        return "too_short"
    letters = sum(c.isalpha() for c in stripped)
    if letters < 0.5 * len(_WS.sub("", stripped)):
        return "symbols"
    return None


def is_degenerate(text: str) -> bool:
    """True when the text loops. Empty or short text is not a loop (an answer may be a tool call)."""
    return degeneracy(text) in LOOPS


def ids_loop(ids: list[int]) -> bool:
    """True when a token sequence is stuck in a loop, judged on the ids themselves.

    (1) A handful of tokens over and over (12+ tokens, at most max(2, n/6) distinct); (2) somewhere
    one short pattern (period 1..32) repeats at least 4 times in a row over at least 24 tokens, even
    if the sequence escapes the loop at the end; (3) in 64+ tokens, fewer than 20% of the 3-grams are
    distinct (a loop with small variations). Normal text, code and lists pass all three.
    """
    n = len(ids)
    if n >= 12 and len(set(ids)) <= max(2, n // 6):
        return True
    for period in range(1, 33):
        if n < 2 * period:
            break
        run = 0
        for i in range(period, n):
            run = run + 1 if ids[i] == ids[i - period] else 0
            if run + period >= max(24, 4 * period):
                return True
    if n >= 64:
        grams = {tuple(ids[i : i + 3]) for i in range(n - 2)}
        if len(grams) / (n - 2) < 0.2:
            return True
    return False


def output_degenerate(ids: list[int], stop_ids: Collection[int], decode: Callable[[list[int]], str] | None = None) -> bool:
    """A generated answer (ids, stop tokens included) is degenerate: nothing, a loop of ids, or, with
    ``decode``, text that loops with small variations that exact-id repeats miss."""
    text_ids = [t for t in ids if t not in stop_ids]
    if not text_ids:
        return True
    if ids_loop(text_ids):
        return True
    return decode is not None and is_degenerate(decode(text_ids))
