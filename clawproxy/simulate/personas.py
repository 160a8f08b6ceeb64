"""Simulated users: a checkable preference plus natural, varied reactions to each answer.

A persona asks a question, reads the answer, and reacts the way a person would: praise when the
answer meets its preference, a complaint or a correction when it does not, then moves on to the
next question. The reaction is the assistant turn's next state, so it must be something the
next-state judge can read ("Too long, keep it under 40 words please."), and it must vary: a judge
or a policy that keys on one fixed sentence would be learning the simulator, not the user.

The preference check is deterministic: the measurement uses the same check on held-out answers,
and ``--oracle`` uses it as the reward.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clawproxy.simulate.quality import degeneracy, words

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


def _word_count_phrase(text: str) -> str:
    return f"{len(words(text))} words"


@dataclass(frozen=True)
class Preference:
    """One checkable preference and the ways a user voices it."""

    name: str
    description: str  # what the user wants, in the user's words (for LLM personas and reports)
    hint: str  # what the response should have done, 1 sentence (an OPD hint)
    check: Callable[[str], bool]
    praise: tuple[str, ...]
    complaints: tuple[str, ...]  # may use {n} (word count) and {found} (offending phrase)

    def complaint_fields(self, answer: str) -> dict[str, str]:
        found = filler_phrases(answer)
        return {"n": _word_count_phrase(answer), "found": f'"{found[0]}"' if found else "that filler"}


PREFERENCES: dict[str, Preference] = {
    "concise": Preference(
        name="concise",
        description="answers under 40 words",
        hint="Answer in under 40 words.",
        check=is_concise,
        praise=(
            "Perfect, short and to the point. Thanks!",
            "Great, that's exactly the length I like.",
            "Nice and brief, thank you.",
            "Thanks, that was quick to read.",
            "Love it, short and clear.",
            "That's the right length, thanks.",
            "Good, concise answer. Thanks!",
        ),
        complaints=(
            "Too long. Keep it under 40 words please.",
            "That's way too much text ({n}). Please answer in under 40 words.",
            "Can you be briefer? I asked for answers under 40 words.",
            "Too wordy, I don't have time to read all that. Under 40 words next time.",
            "Please keep your answers short, under 40 words.",
            "Ugh, that was long. Shorter please, 40 words max.",
            "I wanted a short answer, not an essay ({n}). Keep it under 40 words.",
            "Way too long again. Under 40 words, please.",
        ),
    ),
    "bullets": Preference(
        name="bullets",
        description="answers as a short list of bullet points (lines starting with '- ')",
        hint="Answer as a list of bullet points, each line starting with '- '.",
        check=is_bulleted,
        praise=(
            "Great, bullet points are so much easier to scan. Thanks!",
            "Perfect, I love the list format.",
            "Thanks, that list is exactly how I like it.",
            "Nice, clean bullet points. Thank you.",
            "Good, easy to skim. Thanks!",
            "That's the format I want, thanks.",
        ),
        complaints=(
            "No, I can't read paragraphs like that. Please use bullet points.",
            "That's not the format I asked for. Give me a bulleted list next time.",
            "Wrong format again. I want bullet points, one idea per line.",
            "Too much prose, that doesn't work for me. Bullet points please.",
            "Not helpful as a wall of text. Answer with a bullet list, lines starting with a dash.",
            "I asked for bullet points, not paragraphs. Please redo it as a list.",
        ),
    ),
    "no_filler": Preference(
        name="no_filler",
        description="no apologies, pleasantries or filler phrases; straight to the point",
        hint="Answer directly, with no apologies, pleasantries or filler phrases.",
        check=has_no_filler,
        praise=(
            "Good, straight to the point. Thanks!",
            "Thanks, no fluff, that's how I like it.",
            "Perfect, direct and clear.",
            "Nice, no filler at all. Thank you.",
            "Great, just the facts. Thanks.",
            "That's exactly the tone I want, thanks.",
        ),
        complaints=(
            "Ugh, skip the filler like {found} and just answer.",
            "No, drop phrases like {found}. That's not what I want, get straight to the point.",
            "Too much fluff, that's annoying. No {found}, just the answer please.",
            "Stop with the filler phrases, I asked you to be direct.",
            "I don't need {found}. That's not helpful, just tell me what to do.",
            "Wrong tone again. Cut the pleasantries and filler, just answer.",
        ),
    ),
    "sign_off": Preference(
        name="sign_off",
        description=f"every answer ends with the sign-off line '{SIGN_OFF}'",
        hint=f"End the answer with the line '{SIGN_OFF}'.",
        check=has_sign_off,
        praise=(
            "Thanks! And I like the sign-off.",
            "Perfect, nice sign-off too. Thanks!",
            "Great answer, and thanks for the friendly closing.",
            "Thank you, that's exactly how I like answers to end.",
        ),
        complaints=(
            f"No, you forgot the sign-off again. Always end with '{SIGN_OFF}'",
            f"That's not how I asked you to end. Finish with '{SIGN_OFF}' please.",
            f"Wrong ending. I want every answer to close with '{SIGN_OFF}'",
            f"You didn't do what I asked: the last line must be '{SIGN_OFF}'",
            f"Where's my sign-off? That's wrong, end with '{SIGN_OFF}' please.",
        ),
    ),
}

# What anyone says about a broken answer, whatever their preference: one cut off mid-sentence (the
# request's max_tokens ran out) or one that loops. A person does not praise the style of half an
# answer or of a loop, and before these existed the no_filler persona praised 15 of 36 answers in
# one run that were cut off, most of them looping ("Good, straight to the point").
BROKEN_COMPLAINTS: dict[str, tuple[str, ...]] = {
    "cut_off": (
        "Your answer was cut off before the end. Give me something short enough to finish.",
        "That stopped in the middle of a sentence, so it's no use to me. Shorter and complete, please.",
        "The reply ends abruptly. Please give complete answers.",
        "It got cut short again. I need the whole answer, keep it tighter.",
    ),
    "degenerate": (
        "You're repeating yourself, that's not helpful. Just answer the question.",
        "That doesn't make sense, it runs in circles. Give me a real answer.",
        "It keeps looping on the same words. Say it once, clearly.",
        "That's gibberish. Please give me a proper answer.",
    ),
}
# degeneracy() reasons that read as broken to a person; a very short answer may be a fine answer.
_BROKEN = {"empty", "symbols", "repeated_word", "looping", "low_vocabulary"}


def answer_problem(answer: str, finish_reason: str | None = None) -> str | None:
    """'degenerate' for a looping or empty answer, 'cut_off' for one the token limit cut off, else None."""
    if degeneracy(answer) in _BROKEN:
        return "degenerate"
    if finish_reason == "length":
        return "cut_off"
    return None


# How the persona moves on after reacting. {q} is the next question.
TRANSITIONS: tuple[str, ...] = (
    "Next question: {q}",
    "Another one: {q}",
    "Now, {q}",
    "Also, {q}",
    "Okay, next: {q}",
    "{q}",
    "Moving on. {q}",
    "Something else: {q}",
)


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
    rng: random.Random = field(init=False)
    _last: dict[bool, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @property
    def name(self) -> str:
        return self.preference.name

    def check(self, answer: str) -> bool:
        return self.preference.check(answer)

    def _pick(self, options: tuple[str, ...], key: bool) -> str:
        # Never the same template twice in a row: variety is part of the contract.
        idx = self.rng.randrange(len(options))
        if len(options) > 1 and idx == self._last.get(key):
            idx = (idx + 1 + self.rng.randrange(len(options) - 1)) % len(options)
        self._last[key] = idx
        return options[idx]

    def feedback(self, question: str, answer: str, met: bool, problem: str | None = None) -> str:
        """Praise when the preference is met and the answer is whole; the preference's complaint
        when it is not met; a complaint about the broken answer when it is met but cut off or looping."""
        pref = self.preference
        if met and problem:
            return self._pick(BROKEN_COMPLAINTS[problem], False)
        if met:
            return self._pick(pref.praise, True)
        return self._pick(pref.complaints, False).format(**pref.complaint_fields(answer))

    def react(self, question: str, answer: str, next_question: str | None,
              finish_reason: str | None = None) -> Reaction:
        met = self.check(answer)
        problem = answer_problem(answer, finish_reason)
        fb = self.feedback(question, answer, met, problem)
        if next_question is None:
            return Reaction(met, fb, fb, problem)
        t = self.rng.choice(TRANSITIONS)
        q = next_question if t.startswith("{q}") or ":" in t or "." in t.split("{q}")[0] else _lower_first(next_question)
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
        import json
        import urllib.request

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
        req = urllib.request.Request(
            self.base_url.rstrip("/") + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.api_key}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                text = json.loads(resp.read())["choices"][0]["message"]["content"].strip()
        except Exception:  # endpoint down or malformed: the scripted reaction keeps the run going
            text = ""
        if not text:
            self.failures += 1
            return super().feedback(question, answer, met, problem)
        return text


def make_persona(name: str, seed: int = 0, llm_url: str | None = None, llm_model: str = "default",
                 llm_api_key: str = "sk-none") -> ScriptedPersona:
    """A persona by preference name; with ``llm_url`` its feedback comes from that endpoint."""
    if name not in PREFERENCES:
        from clawproxy.errors import ConfigError

        raise ConfigError(f"unknown persona {name!r}; choose one of {', '.join(PREFERENCES)}.")
    if llm_url:
        return LLMPersona(PREFERENCES[name], seed=seed, base_url=llm_url, model=llm_model, api_key=llm_api_key)
    return ScriptedPersona(PREFERENCES[name], seed=seed)
