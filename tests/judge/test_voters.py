import pytest

from judge.extract import JudgeInput
from judge.hints import QUOTE_FRAME, feedback_hint
from judge.lexical import tool_failed
from judge.voters import LexicalVoter, MalformedVote, Vote, final_hint, majority, parse_vote


@pytest.mark.parametrize(
    "raw,score,hint",
    [
        ("Score: +1\nHint: none", 1, None),
        ("Score: -1\nHint: Answer in under 40 words.", -1, "Answer in under 40 words."),
        ("score: 0", 0, None),
        ("**Score:** -1\n**Hint:** Use Ottawa.", -1, "Use Ottawa."),
        ("<think>Score: +1 maybe</think>\nScore: -1\nHint: be brief", -1, "be brief"),
        ("Score: 1\nHint: n/a", 1, None),
        ("Score: − 1\nHint: none", -1, None),
    ],
)
def test_parse_vote(raw, score, hint):
    assert parse_vote(raw) == (score, hint)


@pytest.mark.parametrize("raw", ["", "good", "The answer was fine.", "Score: +2", "Score: 0.5",
                                 "Score: +1\nScore: -1", "Rating: +1"])
def test_parse_vote_rejects_malformed(raw):
    with pytest.raises(MalformedVote):
        parse_vote(raw)


def V(s):
    return Vote(s)


@pytest.mark.parametrize(
    "scores,expected",
    [
        ([1, 1, -1], 1),
        ([-1, -1, 1], -1),
        ([1, 0, -1], 0),          # three-way tie
        ([1, -1], 0),             # tie
        ([1, -1, None], 0),       # tie among valid votes
        ([None, None, None], 0),  # all failed
        ([-1, None, None], -1),   # the only valid vote
        ([0, 0, 1], 0),
        ([1, 1, 1], 1),
    ],
)
def test_majority(scores, expected):
    assert majority([V(s) for s in scores]) == expected


def test_final_hint_only_for_negative_and_from_agreeing_votes():
    votes = [Vote(1, None), Vote(-1, "be shorter"), Vote(-1, "use bullets")]
    assert final_hint(votes, -1) == "be shorter"
    assert final_hint(votes, 1) is None


def _inp(next_state, role="user", request="Explain recursion."):
    return JudgeInput(request=request, response="(long answer)", next_state=next_state, role=role)


@pytest.mark.parametrize(
    "text,score",
    [
        ("thanks, that's perfect", 1),
        ("way too long. shorter please", -1),
        ("thanks, but I wanted just one paragraph", -1),  # mixed: the correction wins
        ("ok", 0),
        ("👍", 1),
        ("wow, thanks for nothing", -1),
    ],
)
def test_lexical_voter(text, score):
    assert LexicalVoter().vote(_inp(text), 0).score == score


@pytest.mark.parametrize(
    "text,failed",
    [
        ("Error: ENOENT: no such file or directory", True),
        ("bash: foo: command not found\n(exit code 127)", True),
        ("Traceback (most recent call last):\n  File \"x.py\"\nValueError: bad", True),
        ("40 passed, 0 failed in 2.1s", False),
        ("Successfully wrote 32 bytes to notes.md", False),
        ("(no output)", False),
        ('{"status": "ok", "error": null}', False),
    ],
)
def test_tool_errors(text, failed):
    assert tool_failed(text) is failed
    assert LexicalVoter().vote(_inp(text, role="tool"), 0).score == (-1 if failed else 1)


def test_hints_quote_corrective_feedback():
    # framed as a reply to an earlier answer: the teacher never sees the answer the reply is about
    assert feedback_hint(_inp("too long, keep it under 40 words")) == QUOTE_FRAME.format(
        said="too long, keep it under 40 words")
    assert feedback_hint(_inp("No, it's 'tabs'")) == QUOTE_FRAME.format(said="No, it’s ’tabs’")
    assert feedback_hint(_inp("useless")) is None  # no corrective content, no hint
    tool_hint = feedback_hint(_inp("Error: EACCES: permission denied, open '/etc/x'", role="tool"))
    assert tool_hint is not None and "permission denied" in tool_hint


@pytest.mark.parametrize(
    "reply",
    [
        "Can you be briefer? I asked for answers under 40 words. Another one: What should I do if my phone gets wet?",
        "Please keep your answers short, under 40 words. Also, how can I be more productive in the morning?",
        "Too long. Keep it under 40 words please. Moving on. What is a good way to remember names?",
        "Way too long again. Under 40 words, please. How do I take care of a new puppy?",
        "Way too long again. Under 40 words, please. Okay, next: how do I take care of a new puppy?",
        "Less waffle, 40 words tops\n\nHow do I take care of a new puppy?",  # no full stop: the line ends it
        "Less waffle, 40 words tops\nWhat is a good way to remember names?",
    ],
)
def test_hints_drop_the_next_request(reply):
    """The teacher is shown the correction, not the next question (it would answer that instead)."""
    hint = feedback_hint(_inp(reply))
    assert hint is not None and "40 words" in hint
    assert "?'" not in hint and "puppy" not in hint and "phone" not in hint and "names" not in hint
    assert "morning" not in hint


def test_hints_keep_corrective_questions():
    hint = feedback_hint(_inp("No, that's wrong. Can you redo it with tabs instead of spaces?"))
    assert hint is not None and "tabs instead of spaces" in hint
    hint = feedback_hint(_inp("That's wrong, it fails to compile. Now it's even worse than before. Next: add a README."))
    assert hint is not None and "even worse" in hint and "README" not in hint
