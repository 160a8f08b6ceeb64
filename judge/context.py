"""Votes that see the turn before: what the reply means depends on what the answer did.

Real people's unhappy replies mostly carry no emotion word. They decline politely after the
assistant failed ("ok, thanks anyway" after "sorry, nothing matches"), ask again for what they had
asked, or name the value that was wrong ("saturday!!" after a booking for Sunday). A reply read
alone misses all three, so this module reads it against the answer and the request:

- ``answer_failed``: the answer reports that it found, booked or could do nothing, and offers
  nothing else;
- ``closes``: the reply ends or declines the exchange (thanks, bye, never mind, fine);
- ``asks``: the reply asks for something (a question or a request form); how much nearer the
  request it is than the answer (``asks_gap``, from the embedding voter's cosines) marks a re-request;
- ``names_other_value``: the reply names a day, month, time or number where the answer had a
  different one of the same kind.

They are features of the embedding voter's head, and ``reweigh`` is the rule the head applies to its
probabilities: after a failed answer no reply is praise, and a close or a thank-you is a decline.
"""

from __future__ import annotations

import re

import numpy as np

from judge.lexical import BARE_ACK, POSITIVE, PRAISE, cue_rx

_I = re.IGNORECASE
FAILED = re.compile("|".join(f"(?:{p})" for p in (
    r"\b(?:i'm|i am) (?:sorry|afraid)\b",
    r"^\W*sorry\b",
    r"\bsorry[.!]?\s*$",
    r"\bunfortunately\b",
    r"\b(?:couldn't|could not|can't|cannot|wasn't able to|was not able to|(?:am |was |were )?unable to|"
    r"(?:am |was )?not able to) (?:find|book|reserve|locate|get|make|see|place|complete|confirm)\b",
    r"\bthere (?:are|is|were|was) no\b",
    r"\bthere (?:aren't|isn't|weren't|wasn't) any\b",
    r"\b(?:i )?(?:don't|do not|didn't|did not) (?:see|find|have) any\b",
    r"^\W*no \w+(?: \w+){0,5} (?:is|are|was|were|has|have) (?:available|left|open|free)\b",
    r"\bno (?:\w+ ){0,4}(?:available|left|found|matches|match|results?)\b",
    r"\bnothing (?:\w+ ){0,5}(?:matches|match|available|found|left|open|after|before)\b",
    r"\b(?:has|have|had) no (?:\w+ ){0,3}(?:left|available|rooms?|tables?|seats?|space|availability)\b",
    r"\b(?:fully|completely) booked\b",
    r"\bbooked up\b",
    r"\bsold out\b",
    r"\bno availability\b",
    r"\b(?:is|are|was|were) (?:unavailable|not available|closed)\b",
    r"\b(?:booking|reservation|payment|order) (?:failed|didn't go through|did not go through|was declined)\b",
)), _I)
OFFERS = re.compile(r"\?|\b(?:but|however|instead|alternatively|would you like|shall i|should i|do you want|"
                    r"how about|what about|the nearest|the closest|the next)\b", _I)
# the reply-side patterns are cues: tests/judge/test_independence.py checks them against the simulator
CLOSES = cue_rx(
    "closes",
    r"\bbye\b",
    r"\bgoodbye\b",
    r"\bthat's (?:all|it|everything)\b",
    r"\bthat is (?:all|it|everything)\b",
    r"\bnever ?mind\b",
    r"\bforget (?:it|about it)\b",
    r"\bno worries\b",
    r"\bno problem\b",
    r"\boh well\b",
    r"\banyway\b",
    r"\b(?:i'll|i will|i'd|i'll just|i will just) (?:look|try|ask|check|manage|go|search|find)\b",
    r"\bsomewhere else\b",
    r"\belsewhere\b",
    r"\bthat's a (?:shame|pity)\b",
    r"\bnothing else\b",
    r"^\W*(?:ok(?:ay)?|fine|alright|sure|right|oh|ah|hmm+)\W*(?:then|thanks?|thank you|ty)?\W*$",
)
ASKS = cue_rx(
    "asks",
    r"\?",
    r"^\s*(?:i (?:need|want|would like|'d like|am looking for|'m looking for|asked for)|i'm looking for|"
    r"looking for|can you|could you|please|find|give|show|book|get|tell)\b",
    r"\bplease\s*$",
)
_DAY = r"monday|tuesday|wednesday|thursday|friday|saturday|sunday|mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun"
_MONTH = (r"january|february|march|april|may|june|july|august|september|october|november|december|"
          r"jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec")
VALUE_PATTERNS = {
    "day": re.compile(rf"\b(?:{_DAY}|today|tonight|tomorrow)\b", _I),
    "month": re.compile(rf"\b(?:{_MONTH})\b", _I),
    "time": re.compile(r"\b\d{1,2}(?::\d{2})?\s*(?:am|pm)\b|\b\d{1,2}:\d{2}\b|\b\d{1,2}\s*o'?clock\b", _I),
    "number": re.compile(r"(?<![\d:.,])\d+(?:[.,]\d+)?(?![\d:])"),
}
CONTEXT_NAMES = ["answer_failed", "closes", "declines", "asks", "asks_gap", "names_other_value"]

def _norm(text: str) -> str:
    return text.strip().replace("\u2019", "'").replace("\u2018", "'")


def answer_failed(response: str) -> bool:
    """The answer reports that nothing was found, booked or done, and offers nothing in its place
    (an answer that fails but proposes another table can still be taken up)."""
    text = _norm(response)[:600]
    return bool(FAILED.search(text)) and not OFFERS.search(text)


def closes(reply: str) -> bool:
    """The reply ends or declines the exchange (a polite close, giving up, a bare ack)."""
    text = _norm(reply)
    return bool(CLOSES.search(text) or BARE_ACK.match(text))


def asks(reply: str) -> bool:
    """The reply asks for something: a question, or a request in the imperative or "I need" form."""
    return bool(ASKS.search(_norm(reply)))


def _values(text: str) -> dict[str, set[str]]:
    return {name: {v.lower().replace(" ", "") for v in rx.findall(text)} for name, rx in VALUE_PATTERNS.items()}


def names_other_value(reply: str, response: str) -> bool:
    """The reply names a day, month, time or number the answer has a different one of in its place
    ("saturday!!" after "booked for Sunday", "3" after "for 1 night")."""
    mine, theirs = _values(_norm(reply)), _values(_norm(response))
    return any(mine[k] - theirs[k] and theirs[k] - mine[k] for k in VALUE_PATTERNS)


def declines(reply: str) -> bool:
    """What a reply to a failed answer says when the user gives up: a close, thanks, or a positive
    word that asks for nothing ("great. just great.")."""
    text = _norm(reply)
    return closes(text) or bool(PRAISE.search(text)) or (bool(POSITIVE.search(text)) and not asks(text))


def context_features(response: str, reply: str, cos_request: float, cos_response: float) -> np.ndarray:
    """The columns ``CONTEXT_NAMES`` for one turn (the reply already cut to its reaction). A
    re-request is a request form nearer the request than the answer: ``asks_gap``."""
    failed, ask = answer_failed(response), asks(reply)
    return np.array([failed, closes(reply), failed and declines(reply), ask,
                     ask * max(cos_request - cos_response, 0.0), names_other_value(reply, response)],
                    dtype=np.float32)


def reweigh(p: np.ndarray, failed: np.ndarray, declined: np.ndarray) -> np.ndarray:
    """The rule over the head's probabilities ``p`` (rows of p(bad), p(neutral), p(good)): after a
    failed answer no reply is praise (p(good) goes to neutral), and a decline is a complaint (all of
    it goes to bad)."""
    p = np.array(p, dtype=np.float32, copy=True)
    rows = np.atleast_2d(p)
    failed, declined = np.atleast_1d(failed) > 0.5, np.atleast_1d(declined) > 0.5
    rows[failed & ~declined, 1] += rows[failed & ~declined, 2]
    rows[failed, 2] = 0.0
    rows[declined] = (1.0, 0.0, 0.0)
    return rows.reshape(p.shape)
