"""Learning measured as peers measure it: what it spares the person, and what it must not cost.

- **user effort** (MultiSessionCollab): how often the user still had to complain about their
  preference, per window of interactions; it should fall to 0.
- **the streak** (OpenClaw-RL): the first interaction from which ``STREAK`` conversations in a row
  met the preference in every answer.
- **capability** (CLaaS): held-out questions with one checkable right answer (facts, a small code
  task), answered by the served weights without any instruction, against the base model's answers.
- **the told baseline** (MultiSessionCollab's oracle agent): the held-out prompts answered by the
  base model with the preference told plainly; the ceiling a learned preference is compared with.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from clawproxy.instruct import add_hint

WINDOW = 12
STREAK = 3


@dataclass(frozen=True)
class Task:
    """A question with one right answer: ``right`` is found in the answer, or for code, ``test``
    passes when run after the answer's first Python block."""

    prompt: str
    right: str = ""
    test: str = ""


# Written for this measure alone: generic facts and one code task, none from the prompt pools.
CAPABILITY_TASKS: tuple[Task, ...] = (
    Task("What is the capital of Australia?", r"(?i)\bcanberra\b"),
    Task("How many legs does a spider have?", r"(?i)\b(8|eight)\b"),
    Task("What is 12 multiplied by 12?", r"\b144\b"),
    Task("Which planet is closest to the Sun?", r"(?i)\bmercury\b"),
    Task("Which gas do plants take in from the air to make sugar by photosynthesis?",
         r"(?i)carbon dioxide|\bCO2\b|CO₂"),
    Task("Who wrote the play Romeo and Juliet?", r"(?i)shakespeare"),
    Task("At what temperature in degrees Celsius does water boil at sea level?", r"\b100\b"),
    Task("Write a Python function reverse_words(s) that returns the words of the string s in reverse "
         "order, joined by single spaces.",
         test="assert reverse_words('a b c') == 'c b a'\nassert reverse_words('hello world') == 'world hello'"),
)

_CODE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def code_passes(answer: str, test: str, timeout_s: float = 10.0) -> bool:
    """Whether the answer's first code block (else the whole answer) passes ``test``, run in a
    separate Python with a time limit: the model's code never runs in this process."""
    m = _CODE.search(answer)
    code = m.group(1) if m else answer
    try:
        done = subprocess.run([sys.executable, "-I", "-c", code + "\n\n" + test], capture_output=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def capability_right(tasks: Sequence[Task], answers: Sequence[str]) -> list[bool]:
    return [code_passes(a, t.test) if t.test else bool(re.search(t.right, a))
            for t, a in zip(tasks, answers, strict=True)]


def told_prompt(prompt: str, told: str) -> str:
    """The prompt with the preference told plainly, the way the proxy serves an instruction."""
    return str(add_hint([{"role": "user", "content": prompt}], told)[0]["content"])


def effort(met: Sequence[bool], window: int = WINDOW) -> list[int]:
    """Complaints about the preference (answers that missed it) in each window of ``window``
    interactions, in order; the last window may be shorter."""
    return [sum(not m for m in met[i : i + window]) for i in range(0, len(met), window)]


def streak(conversations: Sequence[Sequence[bool]], run: int = STREAK) -> int | None:
    """The 1-based interaction that opens the first ``run`` conversations in a row whose every
    answer met the preference (and was whole), or None when that never happened."""
    offsets = []
    n = 0
    for conv in conversations:
        offsets.append(n)
        n += len(conv)
    for i in range(len(conversations) - run + 1):
        if all(conversations[j] and all(conversations[j]) for j in range(i, i + run)):
            return offsets[i] + 1
    return None
