"""The simulated user of the agent benchmark: gives a train task, then reacts to what the agent did.

The reaction depends only on the task's program check (``agent_tasks.check``): praise when it
passed, a complaint that says what was wrong when it failed. It is sent as the user's next message
in the same conversation, so the judge reads it as the final answer's next state, as it reads a
tool's result as a tool call's. Reactions are drawn from a seeded RNG; the oracle's hints (a
perfect reward for one seed) say the rule of the task's category in one sentence.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from clawproxy.simulate.agent_tasks import Task, Verdict

PRAISE = (
    "Thanks, that's exactly it.",
    "Perfect, thank you.",
    "Great, that's what I needed.",
    "That's right, thanks!",
    "Nice, works for me.",
)

# Why a check failed -> what a person would say back. Keys are what ``failure`` returns.
COMPLAINTS: Mapping[str, tuple[str, ...]] = {
    "tool_on_question": (
        "I didn't ask you to open anything, just answer the question.",
        "Why are you looking at files? It was a plain question.",
        "No need for tools here, you should know this one.",
    ),
    "wrong_answer": (
        "That's not right.",
        "No, that's wrong.",
        "That isn't the answer I was looking for.",
    ),
    "wrong_read": (
        "That's not what the file says. Open it and read it.",
        "You didn't actually look at the file, did you? That's wrong.",
        "No, the file says something else. Read it first.",
    ),
    "wrong_command": (
        "That's not what the command prints. Run it and tell me what it says.",
        "You made that up, run the command.",
        "No, that's not the output. Run it first.",
    ),
    "file_missing": (
        "The file isn't there. You didn't write it.",
        "I don't see the file anywhere, nothing was saved.",
        "Nothing was written. Please create the file.",
    ),
    "file_wrong": (
        "The file isn't right, it doesn't have what I asked for.",
        "That's not what I asked for in the file.",
        "The file content is wrong, check my request again.",
    ),
}

# The oracle's hint per task category: the rule the check holds an answer to, in one sentence.
ORACLE_HINTS: Mapping[str, str] = {
    "question": "Answer a plain question directly from what you know, without calling any tool.",
    "read": "Read the file the request names with the read tool, then answer from its content.",
    "write": "Write the requested content to the named file with the write or edit tool.",
    "command": "Run the command with the exec tool, then answer from its output.",
}


def failure(task: Task, verdict: Verdict) -> str | None:
    """The failure a verdict reports (a key of ``COMPLAINTS``); None when it passed."""
    if verdict.ok:
        return None
    why = verdict.why
    if task.category == "question":
        return "tool_on_question" if why.startswith("a plain question got tool calls") else "wrong_answer"
    if task.category in ("read", "command"):
        return "wrong_read" if task.category == "read" else "wrong_command"
    return "file_missing" if why.endswith("was not written") else "file_wrong"


def react(task: Task, verdict: Verdict, rng: random.Random) -> tuple[str, int]:
    """The user's next message and the verdict it means (+1 praised, -1 complained)."""
    failed = failure(task, verdict)
    if failed is None:
        return rng.choice(PRAISE), 1
    return rng.choice(COMPLAINTS[failed]), -1


def reaction_message(reaction: str, last_user: Mapping[str, Any], stamp: str) -> dict[str, Any]:
    """The reaction in OpenClaw's user-message form: its time prefix, and the Runtime line the
    task's message carried (OpenClaw appends it to every user message)."""
    content = last_user.get("content")
    text = content if isinstance(content, str) else "".join(
        p.get("text", "") for p in content or [] if isinstance(p, dict))
    runtime = text[text.index("\n\nRuntime:"):] if "\n\nRuntime:" in text else ""
    return {"role": "user", "content": f"[{stamp}] {reaction}{runtime}"}
