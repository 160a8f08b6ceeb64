"""OPD hints: what the response should have done, taken from the feedback itself.

On-policy distillation conditions a teacher on a hint and distils the difference back into the
policy, so a hint must be actionable and short (1–3 sentences). The LLM voter writes its own; the
CPU voters quote the user's corrective reply (the user already said what they wanted), framed as a
reply to an earlier answer, or the tool's error, with one sentence that tells the model to follow
it. A bare "useless" or "👎" says nothing about what to do instead, so it yields no hint.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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


QUOTE_FRAME = "An earlier answer to this got the reply '{said}'. Answer the way that reply asks."


def _quote(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > MAX_QUOTE:
        text = text[: MAX_QUOTE - 1].rstrip() + "…"
    return text.replace("'", "’")


def corrective_part(text: str, request: str = "") -> str:
    """The reply up to where it moves on to a new request.

    A line break ends a sentence, punctuated or not. From the second sentence on, the reply is cut
    at the first sentence without a corrective cue that opens with a transition ("Next question:",
    "Also, ...", "Moving on.") or is a question on another subject (little overlap with the
    request). The first sentence always stays.
    """
    # a line break ends a sentence: a message often puts the next request on a line of its own
    sentences = [x for line in text.splitlines() for x in _SENTENCE.split(" ".join(line.split())) if x]
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
    # the teacher never sees the answer the reply is about: the framing says there was one
    # (chosen on train prompts with bench/hinted.py, bench/results/i24/README.md)
    return QUOTE_FRAME.format(said=_quote(corrective_part(text, inp.request)))


# -- hints written by an LLM from the user's reaction (judge.hints: llm) --------------------------

WRITER_PROMPT = """You turn a user's reaction to an AI assistant's answer into one instruction for the
assistant: what to do differently when it answers again. One sentence, at most 20 words, starting
with a verb. State the user's wish as a rule; never answer the request and never repeat a new
question the user asks. If the reaction asks for no change, write: none"""

# (request, answer, reaction, instruction): generic cases, none from the simulator's banks
WRITER_EXAMPLES = (
    ("Write a note to my landlord about the broken heater.",
     "Dear Sir or Madam, I am writing to formally notify you of a malfunction concerning...",
     "way too stiff, he's a friend. Also can you check my rent math?",
     "Write in a warm, casual tone, as to a friend."),
    ("When did the first moon landing happen?", "The first moon landing was in 1972.",
     "no, that's wrong",
     "Check the facts before answering: the date given was wrong."),
    ("How do I list files in a folder?",
     "Great question! There are many ways to list files. In this answer we will explore...",
     "skip the intro, just the command",
     "Give the command first, with no introduction."),
    ("What's a good name for a cat?", "Whiskers, Luna or Milo.", "thanks! what about a dog?", "none"),
)

WRITER_TEMPLATE = """Request: {request}
Answer: {response}
Reaction: {next_state}"""

MAX_WRITTEN = 300
_PREFIX = re.compile(r"^\s*(?:\**\s*instruction\s*\**\s*[:\-]\s*)", re.IGNORECASE)


def writer_prompt(inp: JudgeInput) -> list[dict[str, str]]:
    # the answer is cut: the writer needs its shape, not all of it, and the prompt stays cheap on a CPU
    messages = [{"role": "system", "content": WRITER_PROMPT}]
    for request, response, reaction, instruction in WRITER_EXAMPLES:
        messages.append({"role": "user", "content": WRITER_TEMPLATE.format(
            request=request, response=response, next_state=reaction)})
        messages.append({"role": "assistant", "content": instruction})
    messages.append({"role": "user", "content": WRITER_TEMPLATE.format(
        request=_clip(inp.request, 1000), response=_clip(inp.response, 1500),
        next_state=_clip(corrective_part(inp.next_state, inp.request), 1000))})
    return messages


def _clip(text: str, n: int) -> str:
    text = text.strip() or "(empty)"
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def parse_written(raw: str) -> str | None:
    """The first non-empty line of the writer's answer, or None for 'none' or nothing usable."""
    line = next((x for x in (raw or "").splitlines() if x.strip()), "")
    line = _PREFIX.sub("", line).strip().strip('"“”').strip()
    if line.lower().rstrip(".") in {"", "none", "n/a", "no instruction"} or len(line.split()) < 2:
        return None
    if len(line) > MAX_WRITTEN:
        line = line[: MAX_WRITTEN - 1].rstrip() + "…"
    return line


# -- hints from the user's memory: more than one reply ---------------------------------------------

MEMORY_FRAME = "Earlier answers to this user got these replies: {said}. Answer the way those replies ask."
EXAMPLE_FRAME = "An earlier answer to this user was:\n\"\"\"{answer}\"\"\"\nThey replied: '{said}'."
EXAMPLES_CLOSE = "Answer the way their replies ask, unlike those answers."
MAX_EXAMPLE = 600


def memory_hint(reactions: list[str]) -> str | None:
    """The user's reactions to earlier answers, newest first, quoted together: one reply rarely says
    what the user wants ("too dense" could mean shorter or structured); several do."""
    said = [_quote(r) for r in reactions if r.strip()]
    if not said:
        return None
    return MEMORY_FRAME.format(said="; ".join(f"'{s}'" for s in said))


def examples_hint(examples: list[tuple[str, str]]) -> str | None:
    """(answer, reaction) pairs shown as examples: a small model copies an example better than it
    reads a critique."""
    parts = [EXAMPLE_FRAME.format(answer=_clip(" ".join(a.split()), MAX_EXAMPLE), said=_quote(r))
             for a, r in examples if a.strip() and r.strip()]
    return "\n".join([*parts, EXAMPLES_CLOSE]) if parts else None


INSTRUCTIONS_PATH = Path(__file__).resolve().parent / "data" / "instructions.txt"
CHOOSER_PROMPT = ("A user of an AI assistant replied to its earlier answers:\n{said}\n"
                  "The one instruction that would have made those answers right for this user:")
CHOOSER_PRIOR = "A user of an AI assistant gave it one instruction:"  # the same candidates, no reactions
# the noisy channel: how likely each reply is from a user who had asked for the instruction
CHANNEL_FRAME = ("A user told an AI assistant: \"{instruction}\" The assistant's next answer did not do that. "
                 "The user replied:")
CHANNEL_PRIOR = "A user read an AI assistant's answer. The user replied:"


def load_instructions(path: Path = INSTRUCTIONS_PATH) -> list[str]:
    """The candidate instructions: one a line, '#' lines are comments."""
    lines = [x.strip() for x in path.read_text().splitlines()]
    return [x for x in lines if x and not x.startswith("#")]


class InstructionChooser:
    """Picks the instruction the user's reactions point to, from a generic bank of hundreds
    (``judge/data/instructions.txt``), instead of asking a small model to write one.

    First a shortlist: the ``shortlist`` instructions whose sentence embedding is nearest the
    reactions' (milliseconds on a CPU). Then, given ``logprobs(prefix, texts)`` (an LLM's,
    ``LLMVoter.continuation_logprobs``), each is scored by log p(instruction | the reactions) -
    log p(instruction | no reactions): pointwise mutual information, so an instruction likely
    anywhere does not win by that alone; the winner needs ``min_gain``. Without an LLM the nearest
    instruction wins if its cosine reaches ``min_similarity``. None: nothing fits (keep the quote).

    ``method="channel"`` scores the other way round: the mean over the reactions of log p(reaction |
    a user who had asked for the instruction) - log p(reaction | any user), as noisy-channel
    prompting (Min et al., 2022) scores labels by the text they explain.
    """

    def __init__(self, logprobs: Callable[[str, list[str]], list[float]] | None = None,
                 instructions: list[str] | None = None, *, embed: Callable[[list[str]], Any] | None = None,
                 shortlist: int = 16, min_gain: float = 1.0, min_similarity: float = 0.35,
                 method: str = "pmi") -> None:
        if method not in ("pmi", "channel"):
            raise ValueError(f"unknown chooser method {method!r}; use 'pmi' or 'channel'")
        self.method = method
        self.logprobs = logprobs
        self.instructions = instructions if instructions is not None else load_instructions()
        self.embed = embed
        self.shortlist = shortlist
        self.min_gain = min_gain
        self.min_similarity = min_similarity
        self._bank: Any = None  # the instructions' embeddings, computed once
        self._prior: dict[str, float] = {}  # log p(instruction | no reactions), the same for every user

    def nearest(self, reactions: list[str]) -> list[tuple[float, str]]:
        """The shortlist: (cosine to the reactions' mean embedding, instruction), nearest first."""
        import numpy as np

        if self.embed is None:
            from judge.embedding import embed as encoder

            self.embed = encoder
        embed = self.embed
        if self._bank is None:
            self._bank = embed(self.instructions)
        query = embed(reactions).mean(axis=0)
        query = query / (np.linalg.norm(query) or 1.0)
        sims = self._bank @ query
        top = np.argsort(-sims)[: self.shortlist]
        return [(float(sims[i]), self.instructions[i]) for i in top]

    def diverse(self, reactions: list[str], k: int, *, taken: Sequence[str] = (), novelty: float = 0.5,
                allowed: Callable[[str], bool] = lambda _: True) -> list[tuple[float, str]]:
        """``k`` of the nearest ``shortlist``, by maximal marginal relevance (Carbonell & Goldstein,
        1998): each next one maximizes its cosine to the reactions minus ``novelty`` times its largest
        cosine to those already chosen or ``taken``. A complaint about paragraphs is nearest to many
        paragraph rules, of which few fix it; the shortlist then also holds its other readings."""
        import numpy as np

        pool = [(sim, x) for sim, x in self.nearest(reactions) if allowed(x)]
        embed = self.embed  # set by nearest
        if not pool or k <= 0 or embed is None:
            return []
        row = {x: i for i, x in enumerate(self.instructions)}
        vecs = self._bank[[row[x] for _, x in pool]]  # embedded once by nearest
        chosen = embed(list(taken)) if taken else np.zeros((0, vecs.shape[1]))
        out: list[tuple[float, str]] = []
        left = list(range(len(pool)))
        while left and len(out) < k:
            overlap = (vecs[left] @ chosen.T).max(axis=1) if len(chosen) else np.zeros(len(left))
            gains = [pool[i][0] - novelty * float(o) for i, o in zip(left, overlap, strict=True)]
            best = left.pop(int(np.argmax(gains)))
            out.append(pool[best])
            chosen = np.vstack([chosen, vecs[best][None, :]])
        return out

    def ranked(self, reactions: list[str]) -> list[tuple[float, str]]:
        """The shortlist with its scores (PMI with an LLM, else the cosine), best first."""
        reactions = [r for r in reactions if r.strip()]
        if not reactions:
            return []
        near = self.nearest(reactions)
        if self.logprobs is None:
            return near
        cands = [x for _, x in near]
        if self.method == "channel":
            return self._channel(reactions, cands)
        todo = [x for x in cands if x not in self._prior]
        if todo:
            self._prior.update(zip(todo, self.logprobs(CHOOSER_PRIOR, [" " + x for x in todo]), strict=True))
        said = "\n".join(f"- {_quote(r)}" for r in reactions)
        given = self.logprobs(CHOOSER_PROMPT.format(said=said), [" " + x for x in cands])
        return sorted(((g - self._prior[x], x) for g, x in zip(given, cands, strict=True)), key=lambda t: -t[0])

    def _channel(self, reactions: list[str], cands: list[str]) -> list[tuple[float, str]]:
        assert self.logprobs is not None
        said = [" " + _quote(r) for r in reactions]
        base = self.logprobs(CHANNEL_PRIOR, said)
        scored = []
        for x in cands:
            lp = self.logprobs(CHANNEL_FRAME.format(instruction=x), said)
            scored.append((sum(a - b for a, b in zip(lp, base, strict=True)) / len(said), x))
        return sorted(scored, key=lambda t: -t[0])

    def choose(self, reactions: list[str]) -> str | None:
        ranked = self.ranked(reactions)
        floor = self.min_similarity if self.logprobs is None else self.min_gain
        if not ranked or ranked[0][0] < floor:
            return None
        return ranked[0][1]
