"""OPD hints: what the response should have done, taken from the feedback itself.

On-policy distillation conditions a teacher on a hint and distils the difference back into the
policy, so a hint must be actionable and short (1–3 sentences). The LLM voter writes its own; the
CPU voters quote the user's corrective reply (the user already said what they wanted; a
correction or redo request is quoted as it is) or the tool's error, with one sentence that tells
the model to follow it. A bare "useless" or "👎" says
nothing about what to do instead, so it yields no hint.
"""

from __future__ import annotations

import re

from judge.extract import JudgeInput
from judge.lexical import Cues, cues, overlap

MAX_QUOTE = 240

# Where a reply stops correcting the last answer and starts the next request: "Too long. Keep it
# short. Next question: how do I ...?" The teacher must see the correction, not a new question it
# would start answering instead.
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
# An opener the simulator also uses must open a labeled train case too (tests/judge/test_independence.py).
TRANSITIONS = (
    "another one", "next question", "new question", "something else", "moving on", "also", "now", "next",
    r"ok(?:ay)?,? (?:next|now|and)", "anyway", "by the way", "unrelated", "separately", "on another note",
)
_NEXT_REQUEST = re.compile(rf"^\s*(?:{'|'.join(TRANSITIONS)})\b", re.IGNORECASE)


def _quote(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > MAX_QUOTE:
        text = text[: MAX_QUOTE - 1].rstrip() + "…"
    return text.replace("'", "’")


def corrective_part(text: str, request: str = "") -> str:
    """The reply up to where it moves on to a new request.

    From the second sentence on, the reply is cut at the first sentence without a corrective cue
    that opens with a transition ("Next question:", "Also, ...", "Moving on.") or is a question on
    another subject (little overlap with the request). The first sentence always stays.
    """
    sentences = [x for x in _SENTENCE.split(" ".join(text.split())) if x]
    kept = sentences[:1]
    for sent in sentences[1:]:
        c = cues(sent, request)
        if c.negative:  # "Now it's too long.", "Also, make it shorter?": still correcting
            kept.append(sent)
            continue
        if _NEXT_REQUEST.match(sent) or (sent.endswith("?") and overlap(sent, request) < 0.5):
            break
        kept.append(sent)
    return " ".join(kept)


def feedback_hint(inp: JudgeInput, c: Cues | None = None) -> str | None:
    """A hint for a turn judged -1, or None when the next state carries no corrective content."""
    text = inp.next_state.strip()
    if not text:
        return None
    if inp.role == "tool":
        first = next((line for line in text.splitlines() if line.strip()), text)
        for line in text.splitlines():
            low = line.lower()
            if "error" in low or "not found" in low or "denied" in low or "failed" in low:
                first = line
                break
        return (
            f"The tool call failed with: '{_quote(first)}'. "
            "Check the tool name, path and arguments against the request before calling it."
        )
    c = c or cues(text, inp.request)
    if c.words < 3 and not (c.correction or c.redo):
        return None
    said = _quote(corrective_part(text, inp.request))
    if c.redo or c.correction:
        # unframed: a small teacher follows the user's words best, and a framed quote makes it open
        # with "Here's a revised version:", which OPD would teach the policy (bench/results/README.md)
        return said
    if c.overlap >= 0.5:
        return f"The user had to repeat the request: '{said}'. Answer exactly that, directly."
    return f"The user replied: '{said}'. Follow that."
