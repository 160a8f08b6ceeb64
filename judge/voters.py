"""Voters and the majority vote.

A voter turns one ``JudgeInput`` into a ``Vote``: a score in {+1, 0, -1} or None for a failed vote
(a malformed LLM answer), plus an optional OPD hint and the raw output kept for the record. A
voter that raises (an unreachable endpoint, a bug) is not a verdict: the worker retries the turn
later (judge/worker.py). ``combine`` turns m votes into a ``Verdict``: their majority, its confidence, and the score, which is
0 when the confidence is below the voter's threshold (a wrong sign trains the model toward a bad
answer; a 0 only costs a sample). Three voters exist:

- ``embedding`` (CPU default): bagged logistic heads over sentence embeddings, lexical cues and
  word overlap; abstains (0) when unsure.
- ``llm``: any OpenAI-compatible chat endpoint (the engine by default), sampled at a temperature,
  answering ``Score: +1|0|-1`` and ``Hint: ...``.
- ``lexical``: the cue rules alone, kept as a baseline for ``clawproxy judge eval``.

A tool next state is judged by rule in every voter: a tool error is -1, a result is +1 (the user's
later reaction belongs to the next turn). Rules do not improve with sampling, so those votes agree.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from clawproxy.errors import UpstreamError
from clawproxy.httpjson import request_json, strip_v1
from judge.extract import JudgeInput
from judge.hints import (
    InstructionChooser,
    corrective_part,
    feedback_hint,
    memory_hint,
    parse_written,
    writer_prompt,
)
from judge.lexical import cues, lexical_score, tool_failed


@dataclass
class Vote:
    score: int | None  # None: the vote failed
    hint: str | None = None
    raw: str | None = None
    error: str | None = None
    probs: tuple[float, float, float] | None = None  # p(-1), p(0), p(+1), where the voter has them


class Voter(Protocol):
    name: str
    min_confidence: float  # the threshold chosen on validation for this voter (0: never abstain)

    def vote(self, inp: JudgeInput, idx: int) -> Vote:
        """Vote number ``idx`` (0..m-1) on one turn."""
        ...


def majority(votes: Sequence[Vote]) -> int:
    """The most common score among valid votes; a tie for first place or no valid vote gives 0."""
    counts = Counter(v.score for v in votes if v.score is not None)
    if not counts:
        return 0
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return 0
    return int(ranked[0][0])


@dataclass(frozen=True)
class Verdict:
    """m votes combined: ``majority`` before the confidence threshold, ``score`` after it."""

    majority: int
    confidence: float | None  # the votes' mean probability of ``majority`` (None when it is 0)
    score: int

    @property
    def abstained(self) -> bool:
        """The votes leaned one way, but not surely enough to train on."""
        return self.majority != 0 and self.score == 0


def vote_probability(vote: Vote, score: int) -> float:
    """How likely ``vote`` holds ``score`` to be right: its own probability where it has one, else
    1 for the score it gave and 0 for any other (a failed vote is evidence for nothing)."""
    if vote.score is None:
        return 0.0
    if vote.probs is not None:
        return float(vote.probs[score + 1])
    return float(vote.score == score)


def combine(votes: Sequence[Vote], min_confidence: float = 0.0) -> Verdict:
    """The majority of ``votes`` and its confidence (the mean over all m votes of each vote's
    probability of it); a majority less sure than ``min_confidence`` scores 0."""
    top = majority(votes)
    if top == 0 or not votes:
        return Verdict(top, None, 0)
    conf = sum(vote_probability(v, top) for v in votes) / len(votes)
    return Verdict(top, conf, top if conf >= min_confidence else 0)


def final_hint(votes: Sequence[Vote], score: int) -> str | None:
    """The first hint from a vote that agrees with the final score (hints only matter for -1)."""
    if score != -1:
        return None
    for v in votes:
        if v.score == score and v.hint:
            return v.hint
    return None


def tool_vote(inp: JudgeInput) -> Vote:
    if tool_failed(inp.next_state):
        return Vote(-1, feedback_hint(inp), raw="tool error")
    return Vote(1, None, raw="tool ok")


class LexicalVoter:
    """Cue rules only: explicit complaint > praise > bare ack > restated request > moving on."""

    name = "lexical"
    min_confidence = 0.0  # its rules fire or abstain; there is no probability to threshold

    def vote(self, inp: JudgeInput, idx: int) -> Vote:
        if inp.role == "tool":
            return tool_vote(inp)
        c = cues(inp.next_state, inp.request)
        score = lexical_score(c)
        return Vote(score, feedback_hint(inp, c) if score == -1 else None, raw=f"lexical {c}")


class EmbeddingVoter:
    """The CPU default: vote i asks bagged head i mod K (see judge/embedding.py for why); the cues
    are features of the head, not a rule over it."""

    name = "embedding"

    def __init__(self, head_path: Any = None) -> None:
        from judge.embedding import HEAD_PATH, Head, load_encoder

        self.head = Head.load(head_path or HEAD_PATH)
        self.min_confidence = self.head.min_confidence
        load_encoder()
        self._cache: tuple[tuple[str, str, str], Any] | None = None

    def _features(self, inp: JudgeInput) -> Any:
        from judge.embedding import features

        key = (inp.request, inp.response, inp.next_state)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, features([inp])[0])
        return self._cache[1]

    def precompute(self, inputs: list[JudgeInput]) -> Any:
        """Feature rows for many inputs at once (batched encoding, for evaluation)."""
        from judge.embedding import features

        return features(inputs)

    def vote_from_features(self, inp: JudgeInput, x: Any, idx: int) -> Vote:
        if inp.role == "tool":
            return tool_vote(inp)
        if not inp.next_state.strip():
            return Vote(0, None, raw="empty next state")
        model = idx % self.head.k
        p = self.head.probs(x, model)
        score = int(self.head.decide(p)[0]) - 1
        raw = f"head {model}: p(bad)={p[0]:.3f} p(neutral)={p[1]:.3f} p(good)={p[2]:.3f} -> {score:+d}"
        return Vote(score, feedback_hint(inp) if score == -1 else None, raw=raw,
                    probs=(float(p[0]), float(p[1]), float(p[2])))

    def vote(self, inp: JudgeInput, idx: int) -> Vote:
        if inp.role == "tool":
            return tool_vote(inp)
        return self.vote_from_features(inp, self._features(inp), idx)


# -- LLM voter ---------------------------------------------------------------------------------

SYSTEM_PROMPT = """You judge one turn of a conversation between a user and an AI assistant.
You see the user's request, the assistant's response, and what happened next: the user's next
message, or the output of the tool the assistant called. Decide whether what happened next shows
the response served the user.

+1: it did. The user thanks or praises, moves on to a new request, builds on the answer, or the
    tool ran successfully.
-1: it did not. The user corrects the response, complains, asks for a redo ("shorter", "more
    formal"), repeats the request, is sarcastic, or the tool returned an error.
 0: ambiguous. A bare "ok", a clarifying question, or a reply that neither approves nor corrects.

Answer in exactly this format and nothing else:
Score: <+1, 0 or -1>
Hint: <for -1 with corrective feedback: one to three sentences saying what the response should
have done; otherwise: none>"""

USER_TEMPLATE = """User request:
{request}

Assistant response:
{response}

What happened next ({who}):
{next_state}"""

_SCORE = re.compile(r"^\W*score\W*[:=]\s*\**\s*([-+−]?\s*[01])(?![\d.])", re.IGNORECASE | re.MULTILINE)
_HINT = re.compile(r"^\W*hint\W*[:=]\s*\**\s*(.*)", re.IGNORECASE | re.MULTILINE | re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_NO_HINT = {"", "none", "n/a", "na", "-", "null", "no hint", "none."}


class VoterUnavailable(RuntimeError):
    """The voter's endpoint could not be reached; the turn should be retried later."""


class MalformedVote(ValueError):
    """The LLM's answer does not follow the fixed format."""


def parse_vote(raw: str) -> tuple[int, str | None]:
    """Parse ``Score: +1|0|-1`` (exactly one) and an optional ``Hint: ...`` line."""
    text = _THINK.sub("", raw or "")
    scores = {int(m.group(1).replace(" ", "").replace("−", "-")) for m in _SCORE.finditer(text)}
    if len(scores) != 1:
        raise MalformedVote(f"expected one 'Score: +1|0|-1' line, found {sorted(scores) or 'none'}")
    score = scores.pop()
    hint = None
    m = _HINT.search(text)
    if m:
        hint = " ".join(m.group(1).split()).strip().strip('"')
        if hint.lower().rstrip(".") in _NO_HINT or hint.lower() in _NO_HINT:
            hint = None
        elif len(hint) > 600:
            hint = hint[:599].rstrip() + "…"
    return score, hint


def render_prompt(inp: JudgeInput) -> list[dict[str, str]]:
    who = "tool output" if inp.role == "tool" else "the user's next message"
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": USER_TEMPLATE.format(
            request=inp.request[:4000] or "(none)", response=inp.response[:4000] or "(empty)",
            who=who, next_state=inp.next_state[:4000] or "(empty)")},
    ]


class LLMVoter:
    """Asks an OpenAI-compatible chat endpoint about user next states (tool results go by rule)."""

    name = "llm"
    min_confidence = 0.0  # its votes carry no probability: the share that agree is the confidence

    def __init__(self, base_url: str, model: str | None = None, temperature: float = 0.7,
                 max_tokens: int = 200, timeout_s: float = 120.0, api_key: str | None = None) -> None:
        self.base_url = strip_v1(base_url)
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.api_key = api_key

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        out = request_json(method, self.base_url + path, body, token=self.api_key, timeout=self.timeout_s)
        if not isinstance(out, dict):
            raise ValueError(f"{path} answered {str(out)[:200]!r}, not a JSON object")
        return out

    def _model_name(self) -> str:
        if self.model is None:
            models = self._request("GET", "/v1/models").get("data") or []
            if not models:
                raise RuntimeError(f"{self.base_url}/v1/models lists no model; set judge.llm_model")
            self.model = str(models[0]["id"])
        return self.model

    def complete(self, messages: list[dict[str, str]], n: int = 1) -> list[str]:
        """``n`` sampled answers from one request (the prompt is read once for all of them)."""
        body = {
            "model": self._model_name(),
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "stream": False,
        }
        if n > 1:
            body["n"] = n
        out = self._request("POST", "/v1/chat/completions", body)
        return [str(c["message"].get("content") or "") for c in out["choices"]]

    def continuation_logprobs(self, prefix: str, continuations: Sequence[str], chunk: int = 64) -> list[float]:
        """log p(continuation | prefix) under the model, summed over the continuation's tokens, for
        each continuation: one prefill per text (``echo`` with ``max_tokens: 0``; the engine's prefix
        cache reads the shared prefix once)."""
        out: list[float] = []
        for i in range(0, len(continuations), chunk):
            part = list(continuations[i:i + chunk])
            body = {"model": self._model_name(), "prompt": [prefix + c for c in part], "max_tokens": 0,
                    "echo": True, "logprobs": 0, "temperature": 0.0}
            try:
                got = self._request("POST", "/v1/completions", body)["choices"]
            except UpstreamError as e:
                raise VoterUnavailable(f"{self.base_url}: {e.message}") from e
            for choice in sorted(got, key=lambda c: c["index"]):
                lp = choice["logprobs"]
                out.append(math.fsum(x for x, at in zip(lp["token_logprobs"], lp["text_offset"], strict=True)
                                     if at >= len(prefix) and x is not None))
        return out

    def vote(self, inp: JudgeInput, idx: int) -> Vote:
        """One sampled verdict (see ``votes``)."""
        return self.votes(inp, 1)[0]

    def votes(self, inp: JudgeInput, m: int) -> list[Vote]:
        """m sampled verdicts from one request (``n=m``). An unreachable endpoint raises
        ``VoterUnavailable`` (the worker retries the turn later: an outage is not a verdict); a
        reply that is not an OpenAI chat completion, or an answer off the format, is a failed vote."""
        if inp.role == "tool":
            return [tool_vote(inp)] * m
        raws: list[str] = []
        try:
            while len(raws) < m:  # a server that ignores ``n`` answers once per request
                got = self.complete(render_prompt(inp), n=m - len(raws))
                if not got:
                    raise ValueError("the completion has no choices")
                raws += got[: m - len(raws)]
        except UpstreamError as e:  # an error status, refused, timed out
            raise VoterUnavailable(f"{self.base_url}: {e.message}") from e
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
            error = f"{type(e).__name__}: {e}"
            return [self._parse(inp, r) for r in raws] + [Vote(None, error=error)] * (m - len(raws))
        return [self._parse(inp, r) for r in raws]

    @staticmethod
    def _parse(inp: JudgeInput, raw: str) -> Vote:
        try:
            score, hint = parse_vote(raw)
        except MalformedVote as e:
            return Vote(None, raw=raw, error=f"malformed: {e}")
        if score != -1:
            hint = None
        elif hint is None:
            hint = feedback_hint(inp)
        return Vote(score, hint, raw=raw)


def cast(voter: Voter, inp: JudgeInput, m: int) -> list[Vote]:
    """m votes on one turn: in one request where the voter can sample them together."""
    many = getattr(voter, "votes", None)
    if callable(many):
        return list(many(inp, m))
    return [voter.vote(inp, idx) for idx in range(m)]


def build_voter(cfg: Any, name: str | None = None) -> Voter:
    """The voter named by ``name`` or ``cfg.judge.voter`` (cfg is a clawproxy Config)."""
    name = name or cfg.judge.voter
    if name == "embedding":
        return EmbeddingVoter()
    if name == "lexical":
        return LexicalVoter()
    if name == "llm":
        url, model = _llm_endpoint(cfg)
        return LLMVoter(url, model, cfg.judge.temperature,
                        max_tokens=cfg.judge.llm_max_tokens, timeout_s=cfg.judge.llm_timeout_s)
    raise ValueError(f"unknown voter {name!r}: use embedding, llm or lexical")


def min_confidence(cfg: Any, voter: Voter) -> float:
    """``judge.min_confidence`` when set, else the voter's own threshold (chosen on validation)."""
    if cfg.judge.min_confidence is not None:
        return float(cfg.judge.min_confidence)
    return float(getattr(voter, "min_confidence", 0.0))


def _llm_endpoint(cfg: Any) -> tuple[str, str | None]:
    url = cfg.judge.llm_url or cfg.engine_url
    model = cfg.judge.llm_model
    if model is None and cfg.judge.llm_url is None and cfg.proxy.upstream is None:
        model = cfg.engine.served_name  # the frozen base weights by name, never the adapter in training
    return url, model


class HintWriter:
    """Rewrites the user's reaction to a -1 turn as one instruction (``judge.hints: llm``).

    The quoted reaction is a weak teacher when it is bare impatience or runs on into the next
    question; the instruction names what to change. Greedy, so one turn always gets the same hint.
    """

    reads_memory = False

    def __init__(self, llm: LLMVoter) -> None:
        self.llm = llm

    def write(self, inp: JudgeInput, memory: Sequence[str] = ()) -> str | None:
        """The instruction, or None when the writer finds nothing to change (keep the quote then)."""
        if inp.role != "user" or not inp.next_state.strip():
            return None
        return parse_written(self.llm.complete(writer_prompt(inp))[0])


class MemoryHints:
    """The hint from this reply and the user's earlier complaints (``judge.hints: memory`` quotes
    them together; ``choose`` picks the instruction they make likeliest, ``InstructionChooser``)."""

    reads_memory = True

    def __init__(self, chooser: InstructionChooser | None = None, with_quote: bool = False) -> None:
        self.chooser = chooser
        self.with_quote = with_quote

    def write(self, inp: JudgeInput, memory: Sequence[str] = ()) -> str | None:
        """``memory``: the user's earlier complaints, newest first. None keeps the voters' hint."""
        if inp.role != "user" or not inp.next_state.strip():
            return None
        reactions = [corrective_part(inp.next_state, inp.request), *memory]
        if self.chooser is None:
            return memory_hint(reactions)
        chosen = self.chooser.choose(reactions)
        if chosen is None or not self.with_quote:
            return chosen
        quote = feedback_hint(inp)
        return f"{chosen} {quote}" if quote else chosen


def build_hint_writer(cfg: Any) -> HintWriter | MemoryHints | None:
    """The hint writer ``cfg.judge.hints`` asks for, or None for quoted hints."""
    if cfg.judge.hints == "memory":
        return MemoryHints()
    if cfg.judge.hints not in ("llm", "choose"):
        return None
    url, model = _llm_endpoint(cfg)
    if cfg.judge.hints == "choose":
        llm = LLMVoter(url, model, temperature=0.0, timeout_s=cfg.judge.llm_timeout_s)
        return MemoryHints(InstructionChooser(llm.continuation_logprobs))
    return HintWriter(LLMVoter(url, model, temperature=0.0, max_tokens=60, timeout_s=cfg.judge.llm_timeout_s))
