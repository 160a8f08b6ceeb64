"""The lexical cues: a style word that asks for something is a redo request."""

from __future__ import annotations

import pytest

from judge.lexical import cues, lexical_score


@pytest.mark.parametrize("reply", [
    "Keep it brief.",
    "Just the answer please.",
    "Thanks, but be more concise.",
    "thanks but brief please",
    "great, now just the names, no intro",
    "Thanks. Keep it brief next time.",
    "Nice. Could you be more concise?",
])
def test_a_style_word_that_asks_for_something_is_a_redo(reply):
    assert lexical_score(cues(reply)) == -1


@pytest.mark.parametrize("reply", ["What about a shorter one?", "Can you make it shorter?", "Why is it longer than before?",
                                   "How could you make it shorter?"])
def test_a_question_about_the_answer_is_still_a_redo(reply):
    assert lexical_score(cues(reply)) == -1
