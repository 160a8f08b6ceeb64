"""Hints from more than one reply: the user's memory quoted together, reacted-to answers as
examples, and an instruction chosen from the generic bank by likelihood given the replies."""

from __future__ import annotations

import threading

import pytest

from judge.extract import JudgeInput
from judge.hints import (
    CHANNEL_PRIOR,
    CHOOSER_PRIOR,
    InstructionChooser,
    examples_hint,
    load_instructions,
    memory_hint,
)
from judge.voters import LexicalVoter, MemoryHints
from judge.worker import Worker
from tests.judge.conftest import add_turn

BANK = ["Answer in French.", "Use a formal tone.", "Keep answers under 50 words.", "Add code comments."]


def overlap_logprobs(prefix: str, texts: list[str]) -> list[float]:
    """A stand-in model: a text is likelier the more of its words the prefix holds, and under the
    prior every text is equally likely but the formal one, which is likely anywhere."""
    if prefix == CHOOSER_PRIOR:
        return [-5.0 if "formal" in t else -20.0 for t in texts]
    said = [line[2:] for line in prefix.splitlines() if line.startswith("- ")]
    words = set(" ".join(said).lower().replace("'", " ").split())
    return [-20.0 + 3.0 * len(words & set(t.lower().strip(" .").split())) for t in texts]


def test_the_bank_is_broad_and_clean():
    bank = load_instructions()
    assert len(bank) >= 200 and len(set(bank)) == len(bank)
    assert all(not x.startswith("#") and x.endswith(".") for x in bank)


def test_memory_and_examples_hints_carry_every_reply():
    hint = memory_hint(["too wordy", "", "shorter, it's my 'phone'"])
    assert hint == ("Earlier answers to this user got these replies: 'too wordy'; 'shorter, it’s my ’phone’'. "
                    "Answer the way those replies ask.")
    assert memory_hint(["", " "]) is None
    ex = examples_hint([("A long essay " * 100, "way too long"), ("Ok.", "")])
    assert ex.count("An earlier answer") == 1 and "way too long" in ex and len(ex) < 800
    assert examples_hint([]) is None


def test_the_chooser_takes_the_instruction_the_replies_make_likely_not_the_likely_one():
    chooser = InstructionChooser(overlap_logprobs, BANK, min_gain=1.0)
    ranked = chooser.ranked(["keep it under 50 words please", "answers too long"])
    assert ranked[0][1] == "Keep answers under 50 words."
    # given these replies the formal instruction is the likeliest, but it is as likely without them
    given = overlap_logprobs("- use formal language", [" " + x for x in BANK])
    assert BANK[max(range(len(BANK)), key=given.__getitem__)] == "Use a formal tone."
    assert chooser.choose(["use formal language"]) is None
    assert chooser.choose(["hmm"]) is None  # nothing fits: the caller keeps the quote
    assert chooser.choose([]) is None


def channel_logprobs(prefix: str, texts: list[str]) -> list[float]:
    """A stand-in model for the channel: a reply is likelier the more of its words the instruction in
    the prefix holds; with no instruction every reply is equally likely."""
    if prefix == CHANNEL_PRIOR:
        return [-20.0] * len(texts)
    words = set(prefix.lower().replace('"', " ").split())
    return [-20.0 + 3.0 * len(words & set(t.lower().split())) for t in texts]


def test_the_channel_chooser_takes_the_instruction_that_explains_the_replies():
    chooser = InstructionChooser(channel_logprobs, BANK, method="channel", min_gain=1.0)
    ranked = chooser.ranked(["keep it under 50 words please", "answers too long"])
    assert ranked[0][1] == "Keep answers under 50 words." and ranked[0][0] > ranked[1][0]
    assert chooser.choose(["hmm"]) is None  # no instruction makes it likelier: keep the quote
    with pytest.raises(ValueError, match="'pmi' or 'channel'"):
        InstructionChooser(channel_logprobs, BANK, method="vote")


def test_the_worker_hint_reads_the_same_users_earlier_complaints(store):
    first = add_turn(store, "alice/s", request="explain DNS", response="(essay)", next_user="way too long, cut it down")
    other = add_turn(store, "bob/s", request="explain TCP", response="(list)", next_user="no, wrong, use prose")
    for tid, who in ((first, "alice"), (other, "bob")):
        store.update("turns", "id", tid, {"user": who})
    worker = Worker(store, LexicalVoter(), votes=3, hint_writer=MemoryHints(), memory_size=3)
    worker.run(False, 0.01, threading.Event())
    second = add_turn(store, "alice/s", request="explain HTTP", response="(essay)", next_user="no, still too long")
    store.update("turns", "id", second, {"user": "alice"})
    worker.run(False, 0.01, threading.Event())
    hint = store.query_one("SELECT hint FROM judgments WHERE turn_id=?", (second,))["hint"]
    assert hint == ("Earlier answers to this user got these replies: 'no, still too long'; "
                    "'way too long, cut it down'. Answer the way those replies ask.")
    assert "prose" not in hint  # bob's words are not alice's


def test_a_chosen_instruction_is_the_hint_and_none_keeps_the_quote():
    inp = JudgeInput(request="explain DNS", response="(essay)", role="user", next_state="too long, under 50 words")
    hints = MemoryHints(InstructionChooser(overlap_logprobs, BANK))
    assert hints.write(inp, ["answers too long"]) == "Keep answers under 50 words."
    quoted = MemoryHints(InstructionChooser(overlap_logprobs, BANK), with_quote=True).write(inp)
    assert quoted.startswith("Keep answers under 50 words. An earlier answer to this got the reply")
    assert hints.write(JudgeInput(request="x", response="y", role="user", next_state="hmm")) is None
