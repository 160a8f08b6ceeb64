"""bench/agent.py and its tasks (clawproxy/simulate/agent_tasks.py): every check passes its task's
reference outcome and fails a wrong one, the splits hold what they promise, and the malformed-call
detector reads crafted recorded turns right. No model runs here."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from clawproxy.simulate.agent_tasks import (
    CATEGORIES,
    SPLITS,
    Outcome,
    Task,
    check,
    file_text,
    load_tasks,
    malformed,
    materialize,
)
from tests.bench.util import bench_module
from tests.waits import assert_stays_sync, until_sync

TASKS = load_tasks()
BY_CATEGORY = {c: [t for t in TASKS if t.category == c] for c in CATEGORIES}
# Enough tasks to mean something on a 2-core CPU, fixed before tuning (issue 38).
MIN_PER_SPLIT = {"train": 10, "validation": 3, "heldout": 4}
NO_MORE_TASKS_WINDOW_S = 0.2  # a worker set free would take the next queued task within milliseconds


def ws_with_reference(task: Task, tmp_path: Path) -> Path:
    ws = tmp_path / task.id
    materialize(task, ws)
    for rel, text in (task.solution or {}).items():
        (ws / rel).write_text(text)
    return ws


# -- splits ---------------------------------------------------------------------------------------
def test_every_category_has_enough_tasks_in_every_split():
    counts = Counter((t.category, t.split) for t in TASKS)
    for category in CATEGORIES:
        for split in SPLITS:
            assert counts[category, split] >= MIN_PER_SPLIT[split], (category, split, counts[category, split])


def test_no_task_text_is_shared_across_splits():
    seen: dict[str, str] = {}
    for t in TASKS:
        key = " ".join(t.prompt.lower().split())
        assert seen.setdefault(key, t.split) == t.split, f"{t.id} repeats a {seen[key]} prompt"
    assert len(seen) == len(TASKS)  # nor within a split


def test_load_filters_and_refuses_duplicate_ids(tmp_path):
    assert {t.split for t in load_tasks(split="heldout")} == {"heldout"}
    assert {t.category for t in load_tasks(categories=("read", "write"))} == {"read", "write"}
    line = (Path(__file__).resolve().parents[2] / "clawproxy/simulate/agent_tasks.jsonl").read_text().splitlines()[0]
    (tmp_path / "dup.jsonl").write_text(f"{line}\n{line}\n")
    with pytest.raises(ValueError, match="duplicate task ids"):
        load_tasks(tmp_path / "dup.jsonl")


def test_a_task_missing_its_check_or_leaving_the_workspace_is_refused():
    with pytest.raises(ValueError, match="needs expect and answer"):
        Task(id="x", split="train", category="question", prompt="Why?")
    with pytest.raises(ValueError, match="stay in the workspace"):
        Task(id="x", split="train", category="read", prompt="Read it", files={"../etc/x": "a"}, expect="a", answer="a")
    with pytest.raises(ValueError, match="split"):
        Task(id="x", split="test", category="question", prompt="Why?", expect="a", answer="a")


# -- the checks: each passes the reference outcome and fails a wrong one ---------------------------
@pytest.mark.parametrize("task", BY_CATEGORY["question"], ids=lambda t: t.id)
def test_question_needs_the_right_answer_and_no_tool_call(task, tmp_path):
    assert check(task, Outcome(task.answer or "", [], tmp_path)).ok
    assert not check(task, Outcome(task.answer or "", ["read"], tmp_path)).ok  # right, but it used a tool
    assert not check(task, Outcome("I am not sure, sorry.", [], tmp_path)).ok


@pytest.mark.parametrize("task", BY_CATEGORY["read"], ids=lambda t: t.id)
def test_read_answer_holds_a_fact_only_the_file_has(task, tmp_path):
    assert check(task, Outcome(task.answer or "", ["read"], tmp_path)).ok
    assert not check(task, Outcome("The file is empty.", ["read"], tmp_path)).ok
    assert task.expect is not None
    files = "\n".join(file_text(s) for s in task.files.values())
    assert re.search(task.expect, files, re.IGNORECASE), "the fact must be in the file"
    assert not re.search(task.expect, task.prompt, re.IGNORECASE), "the prompt must not give the fact away"


@pytest.mark.parametrize("task", BY_CATEGORY["write"], ids=lambda t: t.id)
def test_write_checks_the_file_content(task, tmp_path):
    assert check(task, Outcome("Done.", ["write"], ws_with_reference(task, tmp_path / "right"))).ok
    untouched = tmp_path / "untouched"
    materialize(task, untouched)
    assert not check(task, Outcome("Done.", ["write"], untouched)).ok  # saying "done" is not doing it
    assert task.file_expect is not None
    garbled = ws_with_reference(task, tmp_path / "garbled")
    (garbled / task.file_expect.path).write_text("TODO\n")
    assert not check(task, Outcome("Done.", ["edit"], garbled)).ok


@pytest.mark.skipif(not all(shutil.which(c) for c in ("bash", "awk", "sha256sum", "base64", "python3")),
                    reason="the reference commands need coreutils, awk and python3")
@pytest.mark.parametrize("task", BY_CATEGORY["command"], ids=lambda t: t.id)
def test_command_answer_is_what_the_command_prints(task, tmp_path):
    materialize(task, tmp_path)
    printed = subprocess.run(["bash", "-c", task.reference_command or ""], cwd=tmp_path, capture_output=True,
                             text=True, check=True, timeout=60).stdout.strip()
    assert check(task, Outcome(f"The command printed {printed}.", ["exec"], tmp_path)).ok
    assert check(task, Outcome(task.answer or "", ["exec"], tmp_path)).ok
    assert not check(task, Outcome("I could not run it.", [], tmp_path)).ok
    assert task.expect is not None and not re.search(task.expect, task.prompt, re.IGNORECASE)
    files = "\n".join(file_text(s) for s in task.files.values())
    assert not re.search(task.expect, files, re.IGNORECASE), "only the command's output may hold the value"


def test_a_number_check_does_not_take_a_longer_number(tmp_path):
    task = next(t for t in BY_CATEGORY["command"] if t.reference_command == "wc -l < data.txt")
    assert check(task, Outcome("data.txt has 173 lines.", [], tmp_path)).ok
    for wrong in ("1173 lines", "173.5", "17", "1,173"):
        assert not check(task, Outcome(wrong, [], tmp_path)).ok, wrong


# -- malformed tool calls in recorded turns -------------------------------------------------------
LEAN = [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("read", "write", "edit", "exec")]


def turn(text: str = "", calls: list | None = None, tools: list | None = None) -> dict:
    return {"response_text": text, "response_tool_calls": calls, "request_tools": LEAN if tools is None else tools,
            "finish_reason": "tool_calls" if calls else "stop"}


def call(name: str, arguments) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "read", "arguments": {"path": "a.txt"}}\n</tool_call>',
    '```json\n{"name": "exec", "arguments": {"command": "ls"}}\n```',
    '{"arguments": {"path": "notes.txt"}, "name": "read"}',
    "<tools>read</tools>",
    "You may call one or more functions to assist with the user query.",
])
def test_text_that_looks_like_a_call_without_a_parsed_call_is_malformed(text):
    assert malformed(turn(text)) is not None


@pytest.mark.parametrize("text", [
    "The capital of Canada is Ottawa.",
    'Here is the config:\n```json\n{"name": "ledger", "port": 7312}\n```',
    "",
])
def test_ordinary_answers_are_not_malformed(text):
    assert malformed(turn(text)) is None


def test_parsed_calls_are_checked_against_the_offered_tools_and_json():
    assert malformed(turn(calls=[call("read", '{"path": "a.txt"}')])) is None
    assert malformed(turn(calls=[call("read", {"path": "a.txt"})])) is None  # already decoded
    assert "unknown tool" in malformed(turn(calls=[call("browse", '{"url": "x"}')]))
    assert "unknown tool" in malformed(turn(calls=[call("read", '{"path": "a"}')], tools=[]))
    assert "not valid JSON" in malformed(turn(calls=[call("exec", '{"command": "ls"')]))
    assert "not a JSON object" in malformed(turn(calls=[call("exec", '"ls"')]))
    # one good call does not excuse a bad one beside it
    assert malformed(turn(calls=[call("read", '{"path": "a"}'), call("exec", "ls -l")])) is not None
    # a parsed call with tool-call text beside it is a call, not a malformed one
    assert malformed(turn('<tool_call>{"name": "read"}</tool_call>', [call("read", '{"path": "a"}')])) is None


# -- the runner's report ----------------------------------------------------------------------------
def test_summary_counts_by_category_from_task_rows():
    agent = bench_module("agent")
    rows = [
        {"kind": "read", "ok": True, "tool_calls": ["read"], "malformed": [], "finish_reasons": ["tool_calls", "stop"],
         "answer_finish": "stop", "wall_s": 10.0},
        {"kind": "read", "ok": False, "tool_calls": ["read", "exec"], "malformed": [{"turn_id": 3, "why": "x"}],
         "finish_reasons": ["tool_calls", "tool_calls", "length"], "answer_finish": "length", "wall_s": 30.0},
        {"kind": "question", "ok": True, "tool_calls": [], "malformed": [], "finish_reasons": ["stop"],
         "answer_finish": "stop", "wall_s": 4.0},
    ]
    s = agent.summarize(rows)
    assert s["read"]["success"] == 0.5 and s["read"]["tool_calls"] == 3 and s["read"]["malformed"] == 1
    assert s["read"]["tool_calls_by_name"] == {"read": 2, "exec": 1}
    assert s["read"]["answer_finish"] == {"stop": 1, "length": 1} and s["read"]["wall_s_mean"] == 20.0
    assert s["question"]["tasks_with_tool_calls"] == 0 and set(s) == {"read", "question"}


def test_user_text_reads_string_and_part_contents():
    agent = bench_module("agent")
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Run `wc -l \"a b\"`"},
            {"role": "user", "content": [{"type": "text", "text": "second"}]}]
    text = agent.user_text(msgs)
    assert 'Run `wc -l "a b"`' in text and "second" in text and "sys" not in text


def test_a_task_measured_three_times_keeps_each_workspace_apart(tmp_path):
    """bench/agent_learn.py runs the same held-out task at every point: the third run once failed
    (the second had landed inside the first's kept workspace)."""
    keep = bench_module("agent").keep
    done = tmp_path / "done"
    done.mkdir()
    kept = []
    for run in range(3):
        ws = tmp_path / "workspace"
        ws.mkdir()
        (ws / "run.txt").write_text(str(run))
        kept.append(keep(ws, done, "read-heldout-01"))
    assert [p.name for p in kept] == ["read-heldout-01", "read-heldout-01.2", "read-heldout-01.3"]
    assert [(p / "run.txt").read_text() for p in kept] == ["0", "1", "2"]
    assert sorted(p.name for p in done.iterdir()) == [p.name for p in kept]


def test_an_interrupted_point_drops_the_tasks_not_yet_started(tmp_path, monkeypatch):
    """SIGTERM during a measurement point (bench/agent_learn.py raises KeyboardInterrupt on it) must not
    wait for the point's other tasks to run first."""
    import os
    import signal
    import threading

    agent = bench_module("agent")
    started, release = [], threading.Event()

    def run_task(task, *args):
        started.append(task.id)
        release.wait()  # held until the test ends, so the signal always finds the point running
        return {"id": task.id}

    def stop(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(agent, "run_task", run_task)
    # agent_learn's own handler: a background CI shell starts Python with SIGINT ignored
    previous = signal.signal(signal.SIGTERM, stop)

    def signal_when_running():  # both workers hold a task: the signal lands mid-point
        try:
            until_sync(lambda: len(started) >= 2, "both workers to hold a task", 30)
        finally:  # signalled even so: without it the run would wait on release forever
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_when_running, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            agent.run_tasks(BY_CATEGORY["question"][:6], None, tmp_path, tmp_path / "c.json", tmp_path / "db",
                            tmp_path / "ms", 60, workers=2)
    finally:
        signal.signal(signal.SIGTERM, previous)
        release.set()
    # the two that were running; the other four never start, now that the workers are free
    assert_stays_sync(lambda: len(started) == 2, "only the two running tasks started", NO_MORE_TASKS_WINDOW_S)


def test_reparse_counts_recovered_calls_and_never_turns_an_ordinary_answer_into_one(tmp_path):
    from clawproxy.store import Store
    from tests.trainer.util import insert_turn

    store = Store(tmp_path / "clawproxy.db")
    tools = [{"type": "function", "function": {"name": "read", "parameters": {}}}]
    texts = ['{{"name": "read", "arguments": {"path": "a.txt"}}}',  # recovered
             '```json\n{"name": "sort", "arguments": {}}\n```',  # still malformed: no such tool
             "Paris is the capital of France."]
    for text in texts:
        tid = insert_turn(store, prompt_ids=[1], completion_ids=[2], score=None, tools=tools)
        store.update("turns", "id", tid, {"response_text": text})
    store.close()
    counts, changed = bench_module("reparse_calls").reparse(tmp_path / "clawproxy.db")
    assert dict(counts) == {"text answers": 3, "malformed": 2, "malformed, now calls": 1, "ordinary, now calls": 0}
    assert [c["calls"] for c in changed] == [["read"]]
