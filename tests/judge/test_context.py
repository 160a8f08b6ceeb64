"""What a reply means given the answer before it (judge/context.py), alone and through the voter."""

from __future__ import annotations

import numpy as np
import pytest

from judge.context import answer_failed, asks, closes, declines, names_other_value, reweigh
from judge.extract import JudgeInput
from judge.voters import cast, combine


@pytest.mark.parametrize(("answer", "failed"), [
    ("Sorry, every flight to Oslo on the 3rd is full.", True),
    ("I couldn't find a vet that is open on Sundays near you.", True),
    ("There are no bike shops in Eastville.", True),
    ("The Fig Tree has no tables left at 7pm.", True),
    # a failure that offers something else can still be taken up
    ("The 7pm slot is gone, but I can book 7:30 instead. Shall I?", False),
    ("Booked: the Fig Tree, 7pm, for four.", False),
    ("Eastville has two bike shops: Spoke & Co and Cycle Barn.", False),
])
def test_answer_failed(answer, failed):
    assert answer_failed(answer) is failed


def test_a_close_a_decline_and_a_request():
    assert closes("alright then, I'll search myself") and closes("bye") and closes("ok")
    assert not closes("can you look in Westbury instead?")
    assert declines("cheers anyway") and declines("lovely. just lovely.")
    assert not declines("great, and one in Westbury?")  # a positive word that asks for more is not giving up
    assert asks("could you check Westbury?") and asks("i need one open late")
    assert not asks("grand, cheers")


def test_a_correction_names_another_value_of_the_same_kind():
    assert names_other_value("tuesday!", "Your dentist visit is on Thursday at 9.")
    assert names_other_value("4 people, not 2", "A table for 2 at 8pm is booked.")
    assert names_other_value("8pm", "Booked for 7pm tonight.")
    assert not names_other_value("thursday works", "Your dentist visit is on Thursday at 9.")
    assert not names_other_value("perfect", "A table for 2 at 8pm is booked.")


def test_reweigh_moves_praise_after_a_failure_and_makes_a_decline_a_complaint():
    p = np.array([[0.1, 0.2, 0.7], [0.1, 0.2, 0.7], [0.1, 0.2, 0.7]], dtype=np.float32)
    out = reweigh(p, failed=np.array([0.0, 1.0, 1.0]), declined=np.array([0.0, 0.0, 1.0]))
    np.testing.assert_allclose(out[0], p[0])                  # a good answer: untouched
    np.testing.assert_allclose(out[1], [0.1, 0.9, 0.0], atol=1e-6)  # failed: no praise, the mass is neutral
    np.testing.assert_allclose(out[2], [1.0, 0.0, 0.0])       # failed and declined: a complaint
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-6)


def _verdict(voter, request: str, answer: str, reply: str) -> int:
    inp = JudgeInput(request=request, response=answer, next_state=reply, role="user")
    return combine(cast(voter, inp, 3), voter.min_confidence).score


def test_the_same_thank_you_is_praise_after_a_booking_and_a_decline_after_a_failure(embedding_voter):
    request = "Can you get me a table for two at Basil & Thyme on Friday?"
    worked = "Done: Basil & Thyme, Friday at 7:30pm, table for two, reference BT-41."
    failed = "Sorry, Basil & Thyme has no tables left on Friday."
    for reply in ("ok thanks anyway", "alright, cheers"):
        assert _verdict(embedding_voter, request, failed, reply) == -1, reply
    assert _verdict(embedding_voter, request, worked, "brilliant, thanks") == 1
    assert _verdict(embedding_voter, request, failed, "brilliant, thanks") != 1
