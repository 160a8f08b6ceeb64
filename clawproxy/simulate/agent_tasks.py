"""The agent benchmark's tasks (``agent_tasks.jsonl``), the programs that check them, and the check
for malformed tool calls in recorded turns (bench/agent.py runs them through the real OpenClaw).

Four categories of task (``Task.category``; the JSONL field is ``kind``), each checked by a program,
never by a model:
- ``question``: a plain question; the answer matches ``expect`` and no tool was called;
- ``read``: a file placed in the workspace holds a fact the answer must carry (``expect``);
- ``write``: a file is written or edited; its content afterwards must match ``file_expect``;
- ``command``: a command's output (``reference_command``, run on the workspace) holds a value the
  answer must carry (``expect``).

The splits (train, validation, heldout) were written in one commit before any tuning; held-out
results must never change a task. Every task carries a reference outcome (``answer`` or
``solution``) so the tests prove each check passes a right outcome and fails a wrong one. The
simulated user (issue 38, item 2) is meant to draw its tasks from the train split and react with
these same checks, which is why this lives in the package and not in bench/.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from clawproxy.engine.toolcalls import WRAPPERS, tool_names

TASKS_PATH = Path(__file__).with_name("agent_tasks.jsonl")
CATEGORIES = ("question", "read", "write", "command")
SPLITS = ("train", "validation", "heldout")
ANSWER_CATEGORIES = ("question", "read", "command")


@dataclass(frozen=True)
class FileExpect:
    """What a written file must hold afterwards: every ``all`` regex found, no ``none`` regex found
    (multiline, case-sensitive: a file's exact content is the point of a write task)."""

    path: str
    all: tuple[str, ...] = ()
    none: tuple[str, ...] = ()


@dataclass(frozen=True)
class Task:
    id: str
    split: str
    category: str  # question | read | write | command (the JSONL's "kind")
    prompt: str
    # workspace path -> its text, or a generator: {"lines": "row {i}", "n": 40} or
    # {"ints": 50, "lo": 1, "hi": 999, "seed": 7} (one integer a line)
    files: dict[str, Any] = field(default_factory=dict)
    expect: str | None = None  # regex (case-insensitive) the final answer must match
    file_expect: FileExpect | None = None
    answer: str | None = None  # a right answer, for the tests
    solution: dict[str, str] | None = None  # files a right outcome leaves, for the tests
    reference_command: str | None = None  # the command whose output holds the answer

    def __post_init__(self) -> None:
        where = f"task {self.id!r}"
        if self.category not in CATEGORIES:
            raise ValueError(f"{where}: category {self.category!r} is not one of {', '.join(CATEGORIES)}")
        if self.split not in SPLITS:
            raise ValueError(f"{where}: split {self.split!r} is not one of {', '.join(SPLITS)}")
        if not self.prompt.strip():
            raise ValueError(f"{where}: empty prompt")
        for p in self.files:
            _check_path(p, where)
        if self.category in ANSWER_CATEGORIES:
            if self.expect is None or self.answer is None:
                raise ValueError(f"{where}: a {self.category} task needs expect and answer")
            re.compile(self.expect)
        else:
            if self.file_expect is None or self.solution is None:
                raise ValueError(f"{where}: a write task needs file_expect and solution")
            _check_path(self.file_expect.path, where)
            for rx in (*self.file_expect.all, *self.file_expect.none):
                re.compile(rx)
        if self.category in ("read", "command") and not self.files:
            raise ValueError(f"{where}: a {self.category} task needs a file in its workspace")
        if self.category == "command" and not self.reference_command:
            raise ValueError(f"{where}: a command task needs its reference_command")

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Task:
        fe = d.get("file_expect")
        d = {k: v for k, v in d.items() if k != "kind"} | {"category": d["kind"]}  # the file keeps its field name
        return cls(**{**d, "file_expect": FileExpect(fe["path"], tuple(fe.get("all", ())),
                                                        tuple(fe.get("none", ()))) if fe else None})


@dataclass(frozen=True)
class Outcome:
    """What a run left: OpenClaw's final answer, the tools it called (in order), the workspace."""

    final: str
    tool_calls: list[str]
    workspace: Path


@dataclass(frozen=True)
class Verdict:
    ok: bool
    why: str


def _check_path(p: str, where: str) -> None:
    pp = PurePosixPath(p)
    if pp.is_absolute() or ".." in pp.parts or not p:
        raise ValueError(f"{where}: file path {p!r} must be relative and stay in the workspace")


def load_tasks(path: Path = TASKS_PATH, *, split: str | None = None,
               categories: tuple[str, ...] | None = None) -> list[Task]:
    """The tasks in file order, optionally of one split and some categories. Ids must be unique."""
    tasks = [Task.from_json(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    ids = [t.id for t in tasks]
    if len(ids) != len(set(ids)):
        raise ValueError(f"{path}: duplicate task ids {sorted({i for i in ids if ids.count(i) > 1})}")
    return [t for t in tasks if (split is None or t.split == split) and (categories is None or t.category in categories)]


def file_text(spec: str | dict[str, Any]) -> str:
    """A workspace file's text from its spec (literal text, or a line generator)."""
    if isinstance(spec, str):
        return spec
    if "lines" in spec:
        return "".join(spec["lines"].format(i=i) + "\n" for i in range(1, spec["n"] + 1))
    if "ints" in spec:
        rng = random.Random(spec["seed"])  # seeded: the reference command's output is fixed
        return "".join(f"{rng.randint(spec['lo'], spec['hi'])}\n" for _ in range(spec["ints"]))
    raise ValueError(f"unknown file spec {spec!r}: give text, or lines+n, or ints+lo+hi+seed")


def materialize(task: Task, workspace: Path) -> None:
    """Write the task's files into ``workspace`` (created if missing)."""
    workspace.mkdir(parents=True, exist_ok=True)
    for rel, spec in task.files.items():
        p = workspace / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(file_text(spec))


def check(task: Task, outcome: Outcome) -> Verdict:
    """Whether the outcome does what the task asked, and why not."""
    if task.category in ANSWER_CATEGORIES:
        assert task.expect is not None  # __post_init__ guarantees it
        if not re.search(task.expect, outcome.final, re.IGNORECASE):
            return Verdict(False, f"answer does not match {task.expect!r}")
        if task.category == "question" and outcome.tool_calls:
            return Verdict(False, f"a plain question got tool calls: {', '.join(outcome.tool_calls)}")
        return Verdict(True, "answer matches")
    fe = task.file_expect
    assert fe is not None
    p = outcome.workspace / fe.path
    if not p.is_file():
        return Verdict(False, f"{fe.path} was not written")
    text = p.read_text(errors="replace")
    for rx in fe.all:
        if not re.search(rx, text, re.MULTILINE):
            return Verdict(False, f"{fe.path} lacks {rx!r}")
    for rx in fe.none:
        if re.search(rx, text, re.MULTILINE):
            return Verdict(False, f"{fe.path} still has {rx!r}")
    return Verdict(True, f"{fe.path} is right")


# -- malformed tool calls in recorded turns -----------------------------------------------------
# Text that means the model tried to call a tool but no call was parsed from it.
_TAGS = "|".join(o.strip("<>") for o in WRAPPERS if o.startswith("<")) + "|function_call"  # the reader's tags + one it never reads
_CALL_TEXT = (
    (re.compile(rf"</?\s*({_TAGS})\s*>", re.IGNORECASE), "a tool-call tag in the text"),
    (re.compile(r"you may call (one or more )?functions?", re.IGNORECASE), "the template's tool instructions"),
    (re.compile(r"\"name\"\s*:\s*\"[^\"]*\"[\s\S]*?\"(arguments|parameters)\"\s*:"
                r"|\"(arguments|parameters)\"\s*:[\s\S]*?\"name\"\s*:\s*\"", re.IGNORECASE),
     "JSON with name and arguments in the text"),
)


def offered_tools(turn: dict[str, Any]) -> set[str]:
    """The tool names the recorded request offered (OpenAI ``tools``)."""
    return tool_names(turn.get("request_tools")) or set()


def call_names(turn: dict[str, Any]) -> list[str]:
    """The names of the tool calls parsed from a recorded turn, in order."""
    out: list[str] = []
    for c in turn.get("response_tool_calls") or []:
        fn = c.get("function") if isinstance(c, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        out.append(name if isinstance(name, str) else "?")
    return out


def malformed(turn: dict[str, Any]) -> str | None:
    """Why a recorded assistant turn is a malformed tool call, or None when it is not one.

    Malformed: text that looks like a tool call with no call parsed, or a parsed call that names a
    tool the request did not offer or whose arguments are not a JSON object."""
    calls = turn.get("response_tool_calls") or []
    if not calls:
        text = turn.get("response_text") or ""
        for rx, why in _CALL_TEXT:
            if rx.search(text):
                return why
        return None
    offered = offered_tools(turn)
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict):
            return "a call without a function"
        name = fn.get("name")
        if name not in offered:
            return f"unknown tool {name!r}"
        args = fn.get("arguments")
        try:
            parsed = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            return f"{name} arguments are not valid JSON"
        if not isinstance(parsed, dict):
            return f"{name} arguments are not a JSON object"
    return None
