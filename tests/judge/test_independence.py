"""The judge is not written against the simulated user.

The simulator's feedback bank (clawproxy/simulate/feedback/default.yaml) measures the judge; a cue
that exists only to catch the bank's phrases would turn that measurement into an oracle. So: every
cue pattern that matches a bank phrase must also match a labeled train case (a reason of its own to
exist), and no labeled case or judge test repeats a bank phrase.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clawproxy.simulate.personas import complaint_fields, load_feedback
from judge.eval.dataset import load_cases
from judge.lexical import CUE_PATTERNS


def bank_phrases() -> list[str]:
    fields = complaint_fields("Certainly! " + " ".join(["word"] * 90))
    return [p.format(**fields) if "{" in p else p for p in load_feedback().phrases()]


def _norm(text: str) -> str:
    return " ".join(text.lower().replace("\u2019", "'").split()).strip(" .!?")


def coupled_patterns(phrases: list[str], train_texts: list[str]) -> list[tuple[str, str, str]]:
    """(cue list, pattern, bank phrase) for each pattern that matches a bank phrase and no train case."""
    out = []
    for name, pattern in CUE_PATTERNS:
        rx = re.compile(pattern, re.IGNORECASE)
        hits = [p for p in phrases if rx.search(p.replace("\u2019", "'"))]
        if hits and not any(rx.search(t.replace("\u2019", "'")) for t in train_texts):
            out.append((name, pattern, hits[0]))
    return out


def test_no_cue_exists_only_to_match_the_simulator():
    train = [c.inp.next_state for c in load_cases("train")]
    assert coupled_patterns(bank_phrases(), train) == []


def test_the_check_catches_a_cue_written_for_the_simulator():
    """A cue whose only match is a bank phrase is reported; once a real case needs it, it is not."""
    phrase = bank_phrases()[0]
    train = [c.inp.next_state for c in load_cases("train")]
    CUE_PATTERNS.append(("complaint", re.escape(phrase)))
    try:
        assert ("complaint", re.escape(phrase), phrase) in coupled_patterns(bank_phrases(), train)
        assert ("complaint", re.escape(phrase), phrase) not in coupled_patterns(bank_phrases(), [*train, phrase])
    finally:
        CUE_PATTERNS.pop()


@pytest.mark.parametrize("split", ["train", "validation", "heldout"])
def test_no_labeled_case_is_a_bank_phrase(split):
    bank = {_norm(p) for p in bank_phrases() if len(p.split()) >= 2}
    copied = [c.id for c in load_cases(split) if _norm(c.inp.next_state) in bank]
    assert copied == []


def test_no_judge_test_quotes_the_bank():
    here = Path(__file__).resolve().parent
    phrases = [p for p in bank_phrases() if len(p.split()) >= 3]
    for path in here.glob("*.py"):
        if path.name == Path(__file__).name:
            continue
        text = path.read_text().lower()
        assert not [p for p in phrases if p.lower() in text], path.name
