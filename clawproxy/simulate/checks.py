"""A preference's check, written as data: the keys a persona file's ``check`` may use.

A check is a mapping with one key, or a list of them (all must hold). No code runs from a file:
every key below is a fixed measurement of the answer text, so a person can say what they want
without writing Python, and the same check grades the simulated user's verdicts and the held-out
answers alike.

    words:          {min: N, max: N}   words in the answer (either bound may be left out)
    sentences:      {min: N, max: N}   sentences (split after . ! ? and at line breaks)
    lines:          {min: N, max: N}   non-empty lines
    matches:        REGEX or [REGEX]   each pattern is found somewhere in the answer
    not_matches:    REGEX or [REGEX]   no pattern is found anywhere in the answer
    lines_matching: {pattern: REGEX, min: N, share: F}
                                       at least N non-empty lines match (at their start), and at
                                       least the share F (0-1) of the non-empty lines do
    starts_with:    REGEX              the answer (stripped) begins with a match
    ends_with:      REGEX              the answer (stripped) ends with a match
    all_of:         [CHECK, ...]       every one holds
    any_of:         [CHECK, ...]       at least one holds
    not:            CHECK              it does not hold

Patterns are Python regular expressions searched with ``re.MULTILINE`` (``^`` and ``$`` match at
every line); write ``(?i)`` at the start of one to ignore case.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clawproxy.degenerate import words

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_FLAGS = re.compile(r"^\(\?[aiLmsux]+\)")

KEYS = ("words", "sentences", "lines", "matches", "not_matches", "lines_matching", "starts_with",
        "ends_with", "all_of", "any_of", "not")


class CheckError(ValueError):
    """A check that cannot be read: ``where`` is its path in the file, the message says what to write."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


def sentences(text: str) -> list[str]:
    """Sentences as a reader counts them: split after . ! ? and at line breaks, empty ones dropped."""
    return [s for s in (x.strip() for x in _SENTENCE_END.split(text.strip())) if words(s)]


def nonempty_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


@dataclass(frozen=True)
class Check:
    """A parsed check: ``check(text)`` says whether an answer meets it; ``found(text)`` is the first text a
    ``not_matches`` pattern found (what a complaint may quote), else None."""

    test: Callable[[str], bool]
    finders: tuple[re.Pattern[str], ...] = ()

    def __call__(self, text: str) -> bool:
        return bool(self.test(text))

    def found(self, text: str) -> str | None:
        hits = [m for m in (rx.search(text) for rx in self.finders) if m]
        return min(hits, key=lambda m: m.start()).group(0) if hits else None


def _regex(value: Any, where: str) -> re.Pattern[str]:
    if not isinstance(value, str) or not value:
        raise CheckError(where, "write a regular expression as a string, e.g. '^\\s*- '")
    try:
        return re.compile(value, re.MULTILINE)
    except re.error as e:
        raise CheckError(where, f"{value!r} is not a valid regular expression ({e})") from e


def _regexes(value: Any, where: str) -> list[re.Pattern[str]]:
    items = value if isinstance(value, list) else [value]
    if not items:
        raise CheckError(where, "give at least one regular expression")
    return [_regex(v, f"{where}[{i}]" if isinstance(value, list) else where) for i, v in enumerate(items)]


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckError(where, "write a whole number of 0 or more")
    return value


def _bounds(value: Any, where: str) -> tuple[int, int | None]:
    if not isinstance(value, dict) or not value or set(value) - {"min", "max"}:
        raise CheckError(where, "write {min: N, max: N} (either may be left out), e.g. {max: 39}")
    lo = _count(value.get("min", 0), f"{where}.min")
    hi = None if value.get("max") is None else _count(value["max"], f"{where}.max")
    if hi is not None and hi < lo:
        raise CheckError(where, f"max ({hi}) is below min ({lo})")
    return lo, hi


def _within(n: int, lo: int, hi: int | None) -> bool:
    return n >= lo and (hi is None or n <= hi)


def parse_check(spec: Any, where: str = "check") -> Check:
    """A ``Check`` from a persona file's ``check`` value; a ``CheckError`` names the key and the fix."""
    if isinstance(spec, list):
        if not spec:
            raise CheckError(where, "give at least one check")
        return _all([parse_check(s, f"{where}[{i}]") for i, s in enumerate(spec)])
    if not isinstance(spec, dict) or len(spec) != 1:
        raise CheckError(where, f"write one key per check, one of: {', '.join(KEYS)} (or a list of such checks)")
    key, value = next(iter(spec.items()))
    at = f"{where}.{key}"
    if key in ("words", "sentences", "lines"):
        lo, hi = _bounds(value, at)
        measure: Callable[[str], int] = {
            "words": lambda t: len(words(t)),
            "sentences": lambda t: len(sentences(t)),
            "lines": lambda t: len(nonempty_lines(t)),
        }[key]
        return Check(lambda t: _within(measure(t), lo, hi))
    if key == "matches":
        rxs = _regexes(value, at)
        return Check(lambda t: all(rx.search(t) for rx in rxs))
    if key == "not_matches":
        rxs = _regexes(value, at)
        return Check(lambda t: not any(rx.search(t) for rx in rxs), tuple(rxs))
    if key == "lines_matching":
        if not isinstance(value, dict) or "pattern" not in value or set(value) - {"pattern", "min", "share"}:
            raise CheckError(at, "write {pattern: REGEX, min: N, share: F}, e.g. {pattern: '^\\s*- ', min: 2, share: 0.6}")
        rx = _regex(value["pattern"], f"{at}.pattern")
        least = _count(value.get("min", 1), f"{at}.min")
        share = value.get("share", 0.0)
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
            raise CheckError(f"{at}.share", "write a share between 0 and 1, e.g. 0.6")

        def lines_ok(t: str) -> bool:
            lines = nonempty_lines(t)
            hits = sum(bool(rx.match(ln)) for ln in lines)
            return hits >= least and hits >= share * len(lines)
        return Check(lines_ok)
    if key == "starts_with":
        rx = _regex(value, at)
        return Check(lambda t: bool(rx.match(t.strip())))
    if key == "ends_with":
        pattern = _regex(value, at).pattern
        flags = _FLAGS.match(pattern)  # inline flags must stay at the very start
        lead = flags.group(0) if flags else ""
        end = re.compile(f"{lead}(?:{pattern[len(lead):]})\\Z", re.MULTILINE)
        return Check(lambda t: bool(end.search(t.strip())))
    if key in ("all_of", "any_of"):
        if not isinstance(value, list) or not value:
            raise CheckError(at, "write a list of checks")
        parts = [parse_check(s, f"{at}[{i}]") for i, s in enumerate(value)]
        if key == "all_of":
            return _all(parts)
        return Check(lambda t: any(p(t) for p in parts), tuple(rx for p in parts for rx in p.finders))
    if key == "not":
        inner = parse_check(value, at)
        return Check(lambda t: not inner(t))
    raise CheckError(at, f"unknown check; use one of: {', '.join(KEYS)}")


def _all(parts: list[Check]) -> Check:
    return Check(lambda t: all(p(t) for p in parts), tuple(rx for p in parts for rx in p.finders))
