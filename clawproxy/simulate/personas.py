"""Simulated users: a checkable preference plus natural, varied reactions to each answer.

A persona asks a question, reads the answer, and reacts the way a person would: praise when the
answer meets its preference, a complaint when it does not (or when the answer is broken: cut off,
looping, or a word or two that cannot answer the question), then moves on to the next question.
The reaction is the assistant turn's next state.

A persona is a file (YAML, ``clawproxy simulate --persona-file FILE``; the shipped ones are in
``persona_files/``, the format in docs/personas.md): what the user wants, that preference told
plainly, a declarative check (``checks.py``) and the user's words. The words are written apart from
the judge: the judge is measured on how well it reads them, never tuned to them
(tests/judge/test_independence.py).

The check is deterministic: the measurement uses the same check on held-out answers, and
``--oracle`` uses it as the reward.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from clawproxy.degenerate import answer_flaw, words
from clawproxy.errors import ConfigError
from clawproxy.simulate.checks import CheckError, parse_check

PERSONA_DIR = Path(__file__).resolve().parent / "persona_files"
SHARED_WORDS = PERSONA_DIR / "shared.yaml"
PROBLEMS = ("cut_off", "degenerate", "too_short")


@dataclass(frozen=True)
class Preference:
    """One checkable preference (what the user wants; how they say so lives in their words)."""

    name: str
    description: str  # what the user wants, in the user's words (for LLM personas and reports)
    hint: str  # the preference told plainly, 1 sentence: the told baseline and the oracle's hint
    check: Callable[[str], bool]
    found: Callable[[str], str | None] = lambda _: None  # what a complaint's {found} quotes


def complaint_fields(answer: str, found: str | None = None) -> dict[str, str]:
    """What a complaint may quote: {n} the answer's word count, {found} what the check objected to."""
    return {"n": f"{len(words(answer))} words", "found": f'"{found}"' if found else "that filler"}


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
    too_short: list[str] | None = None  # None: the degenerate phrases

    @field_validator("cut_off", "degenerate", "too_short")
    @classmethod
    def _nonempty(cls, v: list[str] | None) -> list[str] | None:
        return v if v is None else cls._check(v, "broken")


def _transitions(v: list[str] | None) -> list[str] | None:
    if v is not None and (not v or any(t.count("{q}") != 1 for t in v)):
        raise ValueError("transitions: each must contain {q} (the next question) exactly once")
    return v


class PersonaFeedback(_Phrases):
    """One user's words: praise, complaints, the complaints that name the fix (requests), and
    optionally their own broken-answer complaints and transitions."""

    praise: list[str]
    complaints: list[str]
    requests: list[str] = []  # complaints that name the fix ("could I get that as a list")
    broken: Broken | None = None  # None: the shared broken-answer complaints
    transitions: list[str] | None = None  # None: the shared transitions

    @field_validator("praise", "complaints")
    @classmethod
    def _nonempty(cls, v: list[str]) -> list[str]:
        return cls._check(v, "praise/complaints")

    @field_validator("transitions")
    @classmethod
    def _has_question(cls, v: list[str] | None) -> list[str] | None:
        return _transitions(v)

    def unhappy(self) -> list[str]:
        """What the user may say to an answer that misses their preference."""
        return [*self.complaints, *self.requests]


class FeedbackBank(_Phrases):
    """A feedback file: shared broken-answer complaints and transitions, and per-persona phrases."""

    broken: Broken
    transitions: list[str]
    personas: dict[str, PersonaFeedback]

    @field_validator("transitions")
    @classmethod
    def _has_question(cls, v: list[str]) -> list[str]:
        return _transitions(v) or []

    def for_persona(self, name: str) -> PersonaFeedback:
        fb = self.personas.get(name)
        if fb is None:
            raise ConfigError(f"the feedback file has no persona {name!r}; it has {', '.join(self.personas) or 'none'}.")
        return fb.model_copy(update={"broken": fb.broken or self.broken,
                                     "transitions": fb.transitions or self.transitions})

    def phrases(self) -> list[str]:
        """Every phrase in the bank (transitions without their {q})."""
        def broken(b: Broken) -> list[str]:
            return [*b.cut_off, *b.degenerate, *(b.too_short or [])]

        out = [*broken(self.broken), *(t.replace("{q}", "").strip() for t in self.transitions)]
        for fb in self.personas.values():
            out += fb.praise + fb.unhappy()
            if fb.broken:
                out += broken(fb.broken)
            out += [t.replace("{q}", "").strip() for t in fb.transitions or []]
        return [p for p in out if p]


class PersonaFile(_Phrases):
    """A persona file (YAML): what the user wants, its check, and their words (docs/personas.md)."""

    name: str | None = None  # default: the file's name without .yaml
    wants: str
    told: str
    check: Any
    praise: list[str]
    complaints: list[str]
    requests: list[str] = []
    broken: Broken | None = None
    transitions: list[str] | None = None

    @field_validator("praise", "complaints")
    @classmethod
    def _nonempty(cls, v: list[str]) -> list[str]:
        return cls._check(v, "praise/complaints")

    @field_validator("wants", "told")
    @classmethod
    def _text(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("write one sentence")
        return v.strip()

    @field_validator("transitions")
    @classmethod
    def _has_question(cls, v: list[str] | None) -> list[str] | None:
        return _transitions(v)


_FILE_KEYS = {
    "wants": "what the user wants, in their words, e.g. 'answers under 40 words'",
    "told": "the preference told plainly to the model, e.g. 'Answer in under 40 words.'",
    "check": "the check, e.g. {words: {max: 39}} (docs/personas.md lists every key)",
    "praise": "a list of what the user says to an answer they like",
    "complaints": "a list of what the user says to an answer that misses their preference",
}


def _read_yaml(path: Path, what: str, flag: str) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError as e:
        raise ConfigError(f"{what} {path} not found; pass an existing YAML file to {flag}.") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} {path} is not valid YAML: {e}") from e


def _shared() -> dict[str, Any]:
    return dict(_read_yaml(SHARED_WORDS, "shared words file", "--feedback"))


def load_persona_file(path: str | Path) -> tuple[Preference, PersonaFeedback]:
    """A persona file's preference and words (shared broken-answer complaints and transitions filled
    in); a ``ConfigError`` names the bad key and what to write there."""
    path = Path(path)
    data = _read_yaml(path, "persona file", "--persona-file")
    if not isinstance(data, dict):
        raise ConfigError(f"persona file {path}: write a mapping with the keys {', '.join(_FILE_KEYS)} "
                          "(docs/personas.md).")
    try:
        spec = PersonaFile.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        fix = _FILE_KEYS.get(str(first["loc"][0]), "") if first["type"] == "missing" else ""
        msg = f"missing; write {fix}" if fix else first["msg"]
        if first["type"] == "string_type":  # YAML reads a bare no, yes, on or off as true/false
            msg += f" (got {first['input']!r}; put the phrase in quotes)"
        raise ConfigError(f"persona file {path}: {where}: {msg} (docs/personas.md).") from e
    try:
        check = parse_check(spec.check)
    except CheckError as e:
        raise ConfigError(f"persona file {path}: {e} (docs/personas.md).") from e
    shared = _shared()
    name = spec.name or path.stem
    pref = Preference(name, spec.wants, spec.told, check, check.found)
    fb = PersonaFeedback(praise=spec.praise, complaints=spec.complaints, requests=spec.requests,
                         broken=spec.broken or Broken.model_validate(shared["broken"]),
                         transitions=spec.transitions or list(shared["transitions"]))
    return pref, fb


def shipped_personas() -> dict[str, Path]:
    """The persona files that come with clawproxy, by name."""
    return {p.stem: p for p in sorted(PERSONA_DIR.glob("*.yaml")) if p != SHARED_WORDS}


_SHIPPED = {name: load_persona_file(path) for name, path in shipped_personas().items()}
PREFERENCES: dict[str, Preference] = {name: pref for name, (pref, _) in _SHIPPED.items()}


def load_feedback(path: str | Path | None = None) -> FeedbackBank:
    """The feedback bank in ``path`` (YAML; default: the shipped persona files' words)."""
    if path is None:
        shared = _shared()
        return FeedbackBank(broken=Broken.model_validate(shared["broken"]), transitions=shared["transitions"],
                            personas={n: fb.model_copy(update={"broken": None, "transitions": None})
                                      for n, (_, fb) in _SHIPPED.items()})
    path = Path(path)
    data = _read_yaml(path, "feedback file", "--feedback")
    try:
        return FeedbackBank.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"feedback file {path}: {where}: {first['msg']} (see docs/personas.md for the format).") from e


# answer_flaw() reasons that read as broken to any reader.
_BROKEN = {"empty", "symbols", "repeated_word", "looping", "low_vocabulary"}


def answer_problem(answer: str, finish_reason: str | None = None, short_is_broken: bool = True) -> str | None:
    """'degenerate' for a looping or empty answer, 'too_short' for a word or two that cannot answer
    the question (unless ``short_is_broken`` is off: the simulated user before 2026-12), 'cut_off'
    for one the token limit cut off, else None."""
    flaw = answer_flaw(answer)
    if flaw in _BROKEN:
        return "degenerate"
    if flaw == "too_short" and short_is_broken:
        return "too_short"
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
    problem: str | None = None  # 'cut_off' | 'degenerate' | 'too_short': complained about even when met


@dataclass
class ScriptedPersona:
    """A deterministic-given-seed user with one preference (the CPU default)."""

    preference: Preference
    seed: int = 0
    words: PersonaFeedback | None = None  # None: the shipped bank's phrases for this preference
    short_is_broken: bool = True  # a word or two is no answer (False: the simulated user before 2026-12)
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
        """Praise when the preference is met and the answer is whole; the preference's complaint (or
        request) when it is not met; a complaint about the broken answer when it is met but cut off,
        looping or too short to answer."""
        w = self.feedback_words
        if met and problem:
            assert w.broken is not None
            return self._pick(getattr(w.broken, problem) or w.broken.degenerate, False)
        if met:
            return self._pick(w.praise, True)
        return self._pick(w.unhappy(), False).format(**complaint_fields(answer, self.preference.found(answer)))

    def react(self, question: str, answer: str, next_question: str | None,
              finish_reason: str | None = None) -> Reaction:
        met = self.check(answer)
        problem = answer_problem(answer, finish_reason, self.short_is_broken)
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
                  "degenerate": " It repeats itself or makes no sense.",
                  "too_short": " It is too short to answer the question."}.get(problem or "", "")
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


def is_persona_file(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or "/" in name


def preference_of(name: str) -> Preference:
    """The preference of a shipped persona name or a persona file path (a ConfigError names a bad one)."""
    if is_persona_file(name):
        return load_persona_file(name)[0]
    if name not in _SHIPPED:
        raise ConfigError(f"unknown persona {name!r}; choose one of {', '.join(PREFERENCES)}, "
                          "or pass your own file with --persona-file (docs/personas.md).")
    return PREFERENCES[name]


def make_persona(name: str, seed: int = 0, llm_url: str | None = None, llm_model: str = "default",
                 llm_api_key: str = "sk-none", feedback: str | Path | None = None,
                 short_is_broken: bool = True) -> ScriptedPersona:
    """A persona by shipped name or persona file path, speaking its own words (or, with ``feedback``,
    that bank's phrases for its name); with ``llm_url`` its feedback comes from that endpoint instead."""
    pref = preference_of(name)
    words = load_persona_file(name)[1] if is_persona_file(name) else _SHIPPED[name][1]
    if feedback is not None:
        words = load_feedback(feedback).for_persona(pref.name)
    if llm_url:
        return LLMPersona(pref, seed=seed, words=words, short_is_broken=short_is_broken, base_url=llm_url,
                          model=llm_model, api_key=llm_api_key)
    return ScriptedPersona(pref, seed=seed, words=words, short_is_broken=short_is_broken)
