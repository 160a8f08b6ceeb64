"""Simulated users: a checkable preference plus natural, varied reactions to each answer.

A persona asks a question, reads the answer, and reacts the way a person would: praise when the
answer meets its preference, a complaint when it does not, then moves on to the next question. The
reaction is the assistant turn's next state. Its words come from a feedback bank (YAML, default
feedback/default.yaml, ``clawproxy simulate --feedback FILE``), written apart from the judge: the
judge is measured on how well it reads them, never tuned to them (tests/judge/test_independence.py).

The preference check is deterministic: the measurement uses the same check on held-out answers,
and ``--oracle`` uses it as the reward.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from clawproxy.degenerate import answer_flaw, words
from clawproxy.errors import ConfigError

# Apologies, pleasantries and throat-clearing. Matched case-insensitively on word boundaries.
FILLER_PATTERNS: tuple[str, ...] = (
    r"\bsorry\b", r"\bapologi[sz]e\b", r"\bapologies\b", r"\bgreat question\b", r"\bgood question\b",
    r"\bcertainly\b", r"\bof course\b", r"\babsolutely\b", r"\bhope (this|that) helps\b",
    r"\bi hope\b", r"\bfeel free\b", r"\bhappy to help\b", r"\bglad to help\b", r"\bas an ai\b",
    r"\blet me know\b", r"\bin conclusion\b", r"\bremember,", r"\bit'?s (also )?(important|essential|worth) (to|noting)\b",
    r"\bthe (eternal|age-old) (quest|question|adage)\b", r"\bin summary\b", r"\bby following these\b",
    r"\bhere are some tips\b", r"\bi'?d be happy\b",
)
_FILLER = re.compile("|".join(FILLER_PATTERNS), re.IGNORECASE)
_BULLET = re.compile(r"^\s*([-*•+])\s+\S")
SIGN_OFF = "Have a great day!"


def filler_phrases(text: str) -> list[str]:
    """Filler phrases found in ``text`` (empty when there are none)."""
    return [m.group(0) for m in _FILLER.finditer(text)]


def bullet_lines(text: str) -> tuple[int, int]:
    """(bullet lines, non-empty lines) of ``text``; numbered lists are not bullets."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return sum(bool(_BULLET.match(ln)) for ln in lines), len(lines)


def is_concise(text: str, limit: int = 40) -> bool:
    return 0 < len(words(text)) < limit


def is_bulleted(text: str) -> bool:
    """At least two bullet lines, and bullets make up most of the answer's lines."""
    bullets, lines = bullet_lines(text)
    return bullets >= 2 and bullets >= 0.6 * lines


def has_no_filler(text: str) -> bool:
    return bool(text.strip()) and not filler_phrases(text)


def has_sign_off(text: str) -> bool:
    tail = text.strip().splitlines()[-1].strip() if text.strip() else ""
    return tail.lower().rstrip(" .!").endswith(SIGN_OFF.lower().rstrip(" .!"))


def complaint_fields(answer: str) -> dict[str, str]:
    """What a complaint may quote: {n} the answer's word count, {found} a filler phrase it used."""
    found = filler_phrases(answer)
    return {"n": f"{len(words(answer))} words", "found": f'"{found[0]}"' if found else "that filler"}


@dataclass(frozen=True)
class Preference:
    """One checkable preference (what the user wants; how they say so lives in the feedback bank)."""

    name: str
    description: str  # what the user wants, in the user's words (for LLM personas and reports)
    hint: str  # what the response should have done, 1 sentence (an OPD hint)
    check: Callable[[str], bool]


PREFERENCES: dict[str, Preference] = {
    "concise": Preference("concise", "answers under 40 words", "Answer in under 40 words.", is_concise),
    "bullets": Preference("bullets", "answers as a short list of bullet points (lines starting with '- ')",
                          "Answer as a list of bullet points, each line starting with '- '.", is_bulleted),
    "no_filler": Preference("no_filler", "no apologies, pleasantries or filler phrases; straight to the point",
                            "Answer directly, with no apologies, pleasantries or filler phrases.", has_no_filler),
    "sign_off": Preference("sign_off", f"every answer ends with the sign-off line '{SIGN_OFF}'",
                           f"End the answer with the line '{SIGN_OFF}'.", has_sign_off),
}

DEFAULT_FEEDBACK = Path(__file__).resolve().parent / "feedback" / "default.yaml"
PROBLEMS = ("cut_off", "degenerate")


class _Phrases(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @staticmethod
    def _check(phrases: list[str], what: str) -> list[str]:
        if not phrases or any(not p.strip() for p in phrases):
            raise ValueError(f"{what}: give at least one non-empty phrase")
        return phrases


class Broken(_Phrases):
    cut_off: list[str]
    degenerate: list[str]

    @field_validator("cut_off", "degenerate")
    @classmethod
    def _nonempty(cls, v: list[str]) -> list[str]:
        return cls._check(v, "broken")


class PersonaFeedback(_Phrases):
    praise: list[str]
    complaints: list[str]
    broken: Broken | None = None  # None: the bank's shared broken-answer complaints
    transitions: list[str] | None = None  # None: the bank's shared transitions

    @field_validator("praise", "complaints")
    @classmethod
    def _nonempty(cls, v: list[str]) -> list[str]:
        return cls._check(v, "praise/complaints")


class FeedbackBank(_Phrases):
    """A feedback file: shared broken-answer complaints and transitions, and per-persona phrases."""

    broken: Broken
    transitions: list[str]
    personas: dict[str, PersonaFeedback]

    @field_validator("transitions")
    @classmethod
    def _has_question(cls, v: list[str]) -> list[str]:
        if not v or any(t.count("{q}") != 1 for t in v):
            raise ValueError("transitions: each must contain {q} (the next question) exactly once")
        return v

    def for_persona(self, name: str) -> PersonaFeedback:
        fb = self.personas.get(name)
        if fb is None:
            raise ConfigError(f"the feedback file has no persona {name!r}; it has {', '.join(self.personas) or 'none'}.")
        return fb.model_copy(update={"broken": fb.broken or self.broken,
                                     "transitions": fb.transitions or self.transitions})

    def phrases(self) -> list[str]:
        """Every phrase in the bank (transitions without their {q})."""
        out = [*self.broken.cut_off, *self.broken.degenerate, *(t.replace("{q}", "").strip() for t in self.transitions)]
        for fb in self.personas.values():
            out += [*fb.praise, *fb.complaints]
            if fb.broken:
                out += [*fb.broken.cut_off, *fb.broken.degenerate]
            out += [t.replace("{q}", "").strip() for t in fb.transitions or []]
        return [p for p in out if p]


def load_feedback(path: str | Path | None = None) -> FeedbackBank:
    """The feedback bank in ``path`` (YAML; default: the shipped natural bank)."""
    path = Path(path) if path else DEFAULT_FEEDBACK
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"feedback file {path} not found; pass an existing YAML file to --feedback.") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"feedback file {path} is not valid YAML: {e}") from e
    try:
        return FeedbackBank.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"feedback file {path}: {where}: {first['msg']} (see {DEFAULT_FEEDBACK.name} for the format).") from e


# answer_flaw() reasons that read as broken to a person; a very short answer may be a fine answer.
_BROKEN = {"empty", "symbols", "repeated_word", "looping", "low_vocabulary"}


def answer_problem(answer: str, finish_reason: str | None = None) -> str | None:
    """'degenerate' for a looping or empty answer, 'cut_off' for one the token limit cut off, else None."""
    if answer_flaw(answer) in _BROKEN:
        return "degenerate"
    if finish_reason == "length":
        return "cut_off"
    return None


def _lower_first(q: str) -> str:
    return q[0].lower() + q[1:] if q and not q.startswith("I ") else q


@dataclass
class Reaction:
    """The persona's reply to one answer."""

    met: bool  # the preference check (the oracle's reward)
    feedback: str  # the reaction alone
    message: str  # what is sent: the reaction, plus the next question if the conversation goes on
    problem: str | None = None  # 'cut_off' | 'degenerate': complained about even when met


@dataclass
class ScriptedPersona:
    """A deterministic-given-seed user with one preference (the CPU default)."""

    preference: Preference
    seed: int = 0
    words: PersonaFeedback | None = None  # None: the shipped bank's phrases for this preference
    rng: random.Random = field(init=False)
    _last: dict[bool, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        if self.words is None:
            self.words = load_feedback().for_persona(self.preference.name)

    @property
    def feedback_words(self) -> PersonaFeedback:
        assert self.words is not None and self.words.broken is not None and self.words.transitions
        return self.words

    @property
    def name(self) -> str:
        return self.preference.name

    def check(self, answer: str) -> bool:
        return self.preference.check(answer)

    def _pick(self, options: list[str], key: bool) -> str:
        # Never the same template twice in a row: variety is part of the contract.
        idx = self.rng.randrange(len(options))
        if len(options) > 1 and idx == self._last.get(key):
            idx = (idx + 1 + self.rng.randrange(len(options) - 1)) % len(options)
        self._last[key] = idx
        return options[idx]

    def feedback(self, question: str, answer: str, met: bool, problem: str | None = None) -> str:
        """Praise when the preference is met and the answer is whole; the preference's complaint
        when it is not met; a complaint about the broken answer when it is met but cut off or looping."""
        w = self.feedback_words
        if met and problem:
            return self._pick(getattr(w.broken, problem), False)
        if met:
            return self._pick(w.praise, True)
        return self._pick(w.complaints, False).format(**complaint_fields(answer))

    def react(self, question: str, answer: str, next_question: str | None,
              finish_reason: str | None = None) -> Reaction:
        met = self.check(answer)
        problem = answer_problem(answer, finish_reason)
        fb = self.feedback(question, answer, met, problem)
        if next_question is None:
            return Reaction(met, fb, fb, problem)
        transitions = self.feedback_words.transitions
        assert transitions is not None  # the bank's when the persona has none (FeedbackBank.for_persona)
        t = self.rng.choice(transitions)
        lead = t.split("{q}")[0].strip()
        q = next_question if not lead or lead.endswith((".", ":", "?", "!")) else _lower_first(next_question)
        return Reaction(met, fb, fb + "\n\n" + t.format(q=q), problem)


@dataclass
class LLMPersona(ScriptedPersona):
    """Feedback written by an LLM (any OpenAI-compatible endpoint); the check stays scripted.

    For GPU users with a capable model: the reaction is less templated. The preference check is
    still the deterministic one (the curve must be measurable); on any endpoint failure the
    scripted feedback is used so a run never stalls on the persona.
    """

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "default"
    api_key: str = "sk-none"
    temperature: float = 0.9
    failures: int = 0

    def feedback(self, question: str, answer: str, met: bool, problem: str | None = None) -> str:
        from clawproxy.httpjson import request_json, strip_v1

        verdict = "does" if met else "does NOT"
        broken = {"cut_off": " It was cut off before the end.",
                  "degenerate": " It repeats itself or makes no sense."}.get(problem or "", "")
        prompt = (
            f"You are a busy person chatting with an AI assistant. You want {self.preference.description}. "
            f"You asked: {question!r}. The assistant answered:\n---\n{answer}\n---\n"
            f"The answer {verdict} meet your preference.{broken} Reply to the assistant in one or two short "
            f"sentences, in your own words: "
            + ("praise it briefly." if met and not broken else "complain and say exactly what you want instead.")
            + " Do not ask a new question. Reply with the message only."
        )
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 60,
            "temperature": self.temperature,
        }
        try:
            out = request_json("POST", strip_v1(self.base_url) + "/v1/chat/completions", body,
                               token=self.api_key, timeout=60)
            text = out["choices"][0]["message"]["content"].strip()
        except Exception:  # endpoint down or malformed: the scripted reaction keeps the run going
            text = ""
        if not text:
            self.failures += 1
            return super().feedback(question, answer, met, problem)
        return text


def make_persona(name: str, seed: int = 0, llm_url: str | None = None, llm_model: str = "default",
                 llm_api_key: str = "sk-none", feedback: str | Path | None = None) -> ScriptedPersona:
    """A persona by preference name, speaking the phrases of the ``feedback`` bank (default: the
    shipped one); with ``llm_url`` its feedback comes from that endpoint instead."""
    if name not in PREFERENCES:
        raise ConfigError(f"unknown persona {name!r}; choose one of {', '.join(PREFERENCES)}.")
    words = load_feedback(feedback).for_persona(name)
    if llm_url:
        return LLMPersona(PREFERENCES[name], seed=seed, words=words, base_url=llm_url, model=llm_model,
                          api_key=llm_api_key)
    return ScriptedPersona(PREFERENCES[name], seed=seed, words=words)
