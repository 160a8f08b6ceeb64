"""The judge is not written against the simulated user.

The simulated users' words (clawproxy/simulate/persona_files/) measure the judge; a cue
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
from judge.hints import _SENTENCE, TRANSITIONS
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


def _opens(opener: str, text: str) -> bool:
    return re.match(rf"^\s*(?:{opener})\b", text.replace("\u2019", "'"), re.IGNORECASE) is not None


def coupled_transitions(openers, bank: list[str], train_texts: list[str]) -> list[tuple[str, str]]:
    """(opener, bank transition) for each hint opener the simulator uses and no train sentence opens with."""
    sentences = [s for t in train_texts for s in _SENTENCE.split(" ".join(t.split())) if s]
    out = []
    for opener in openers:
        hits = [t for t in bank if _opens(opener, t)]
        if hits and not any(_opens(opener, s) for s in sentences):
            out.append((opener, hits[0]))
    return out


def bank_transitions() -> list[str]:
    fb = load_feedback()
    every = [*fb.transitions, *(t for p in fb.personas.values() for t in p.transitions or [])]
    return [t.replace("{q}", "what is a GPU?") for t in every]


def test_no_hint_transition_exists_only_to_match_the_simulator():
    train = [c.inp.next_state for c in load_cases("train")]
    assert coupled_transitions(TRANSITIONS, bank_transitions(), train) == []


def test_the_check_catches_a_transition_written_for_the_simulator():
    """An opener only the bank uses is reported; one a train case also opens with is not."""
    train = [c.inp.next_state for c in load_cases("train")]
    bank = ["zzyzx, what is a GPU?"]
    assert coupled_transitions(["zzyzx"], bank, train) == [("zzyzx", bank[0])]
    assert coupled_transitions(["zzyzx"], bank, [*train, "Thanks. Zzyzx, a new question."]) == []


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
