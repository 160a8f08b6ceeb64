"""The real OpenClaw client (openclaw@2026.9.6 from the npm registry) in front of `clawproxy start`.

Configured only by what `clawproxy openclaw-config --write` writes. Each test runs OpenClaw with its
own HOME and state dir, against real `clawproxy start` processes on loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from clawproxy.cli import main
from clawproxy.store import Store
from tests.clawproxy.test_supervisor import wait_http
from tests.net import held_port, stop
from tests.openclaw_client import OpenClaw, ensure_openclaw
from tests.waits import until_sync

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def openclaw() -> OpenClaw:
    return ensure_openclaw()


_held = contextlib.ExitStack()


def free_port() -> int:
    """A loopback port held (bound, not listening) until the test ends; servers can still take it."""
    return _held.enter_context(held_port())


@pytest.fixture(autouse=True)
def _release_ports():
    yield
    _held.close()


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, *args], stdout=open(log, "w"), stderr=subprocess.STDOUT,
                            env=env, cwd=ROOT)


@pytest.fixture
def fake_upstream(tmp_path):
    port = free_port()
    proc = _spawn(["-m", "tests.rig.fake_upstream", "--port", str(port)], tmp_path / "fake.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, int, Path]:
    port, data = free_port(), tmp_path / "data"
    proc = _spawn(["-m", "clawproxy.cli", "start", "--port", str(port), "--data-dir", str(data), *args],
                  tmp_path / "clawproxy.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", timeout=900)  # vLLM, and a first model fetch
    except AssertionError:
        stop(proc)
        raise AssertionError((tmp_path / "clawproxy.log").read_text()[-4000:]) from None
    return proc, port, data


def _write_config(home: Path, port: int, *extra: str) -> Path:
    """`clawproxy openclaw-config --write` into this test's OpenClaw home; returns the file."""
    path = home / ".openclaw" / "openclaw.json"
    r = CliRunner().invoke(main, ["openclaw-config", "--port", str(port), "--write", *extra],
                           env={"OPENCLAW_CONFIG_PATH": str(path)})
    assert r.exit_code == 0, r.output
    assert path.exists() and "written to" in r.output
    return path


def _fake_tool_once(cfg_path: Path) -> None:
    """The fake answers with a read(hello.txt) call, then with text once it sees the tool result."""
    cfg = json.loads(cfg_path.read_text())
    cfg["models"]["providers"]["clawproxy"].setdefault("headers", {})["x-fake-mode"] = "tool-once"
    cfg_path.write_text(json.dumps(cfg))


def _main_turns(data: Path) -> list[dict[str, Any]]:
    store = Store(data / "clawproxy.db")
    try:
        return store.query("SELECT * FROM turns WHERE kind='main' ORDER BY id")
    finally:
        store.close()


def _query(data: Path, sql: str, args: tuple = ()) -> list[dict[str, Any]]:
    store = Store(data / "clawproxy.db")
    try:
        return store.query(sql, args)
    finally:
        store.close()


def test_tool_call_round_trip_is_recorded_with_its_next_state(openclaw, fake_upstream, tmp_path):
    proc, port, data = _start(tmp_path, "--upstream", fake_upstream, "--no-train")
    try:
        home = tmp_path / "home"
        cfg_path = _write_config(home, port, "--upstream", fake_upstream)
        _fake_tool_once(cfg_path)
        ws = tmp_path / "ws"
        ws.mkdir()
        (ws / "hello.txt").write_text("the secret word is marmalade\n")

        out = openclaw.run(["agent", "exec", "--config", str(cfg_path), "--cwd", str(ws), "--json",
                            "What does hello.txt say?"], home)
        assert out["ok"] is True and out["status"] == "ok", out

        turns = until_sync(lambda: (t := _main_turns(data)) and len(t) == 2 and t[0]["next_turn_id"] and t,
                           "both turns recorded and linked", 30)
        call, answer = turns
        assert call["session_id"] == answer["session_id"]
        assert call["finish_reason"] == "tool_calls" and answer["finish_reason"] == "stop"
        (tc,) = call["response_tool_calls"]
        assert tc["function"]["name"] == "read"
        assert json.loads(tc["function"]["arguments"]) == {"path": "hello.txt"}
        assert call["next_state_role"] == "tool" and call["next_turn_id"] == answer["id"]
        assert "marmalade" in json.dumps(call["next_state"])
        assert call["trainable"] == 1, call["reason"]

        judged = until_sync(lambda: _query(data, "SELECT score FROM judgments WHERE turn_id=?", (call["id"],)),
                            "the judge's verdict on the tool call", 120)
        assert judged[0]["score"] == 1  # the tool ran and returned the file

        r = CliRunner().invoke(main, ["sessions", "show", call["session_id"], "--data-dir", str(data)],
                               env={"COLUMNS": "400"})
        assert r.exit_code == 0, r.output
        assert "→ read(path=hello.txt)" in r.output
        assert "tool result" in r.output and "marmalade" in r.output
    finally:
        stop(proc)


def test_a_no_learn_config_is_recorded_and_never_judged(openclaw, fake_upstream, tmp_path):
    """`openclaw-config --no-learn`: OpenClaw sends the provider's header on every call, so the
    tool call and the answer are recorded (the next state too) and neither waits for the judge."""
    proc, port, data = _start(tmp_path, "--upstream", fake_upstream, "--no-train")
    try:
        home = tmp_path / "home"
        cfg_path = _write_config(home, port, "--upstream", fake_upstream, "--no-learn")
        _fake_tool_once(cfg_path)  # beside --no-learn's header
        ws = tmp_path / "ws"
        ws.mkdir()
        (ws / "hello.txt").write_text("the secret word is marmalade\n")
        out = openclaw.run(["agent", "exec", "--config", str(cfg_path), "--cwd", str(ws), "--json",
                            "What does hello.txt say?"], home)
        assert out["ok"] is True, out
        call, answer = until_sync(lambda: (t := _main_turns(data)) and len(t) == 2 and t[0]["next_turn_id"] and t,
                                  "both turns recorded and linked", 30)
        assert call["finish_reason"] == "tool_calls" and "marmalade" in json.dumps(call["next_state"])
        assert [(t["reason"], t["trainable"]) for t in (call, answer)] == [("not_learned", 0)] * 2
        store = Store(data / "clawproxy.db")
        try:
            assert store.unjudged_turns(10) == []  # the judge's queue: nothing to take
        finally:
            store.close()
    finally:
        stop(proc)


def test_the_agent_benchmarks_user_reaction_is_the_answers_next_state(openclaw, fake_upstream, tmp_path):
    """bench/agent_learn.py: a task through the real client, then the simulated user's reaction sent
    as the conversation's next message; the proxy links it to the answer and the judge takes it."""
    from clawproxy.simulate.agent_tasks import Task
    from tests.bench.util import bench_module

    agent, learn = bench_module("agent"), bench_module("agent_learn")
    proc, port, data = _start(tmp_path, "--upstream", fake_upstream, "--no-train")
    try:
        url, home = f"http://127.0.0.1:{port}", tmp_path / "home"
        cfg_path = learn.write_openclaw_config(home, "learn.json", url, "lean")
        _fake_tool_once(cfg_path)
        task = Task(id="t", split="train", category="read", prompt="What does hello.txt say?",
                    files={"hello.txt": "the secret word is marmalade\n"}, expect="marmalade", answer="marmalade")
        row = agent.run_task(task, openclaw, home, cfg_path, data / "clawproxy.db", tmp_path / "ws", 300)
        assert row["status"] == "ok" and row["tool_calls"] == ["read"], row
        store = Store(data / "clawproxy.db")
        try:
            call, answer = learn.turns_by_id(store, row["turn_ids"])
            assert call["next_turn_id"] == answer["id"] and answer["finish_reason"] == "stop"
            assert learn.send_reaction(url, answer, "Thanks, that's exactly it.") == 200
            assert learn.wait_linked(store, answer["id"], 30)
            linked = store.get_turn(answer["id"])
            assert (linked["reason"], linked["next_state_role"]) == ("ok", "user")
            assert "exactly it" in json.dumps(linked["next_state"])
            until_sync(lambda: _query(data, "SELECT score FROM judgments WHERE turn_id=?", (answer["id"],)),
                       "the judge's verdict on the answer", 120)
        finally:
            store.close()
    finally:
        stop(proc)


def test_agent_benchmark_tasks_run_two_at_once_each_with_its_own_turns(openclaw, fake_upstream, tmp_path):
    """bench/agent.py's ``run_tasks`` with 2 workers: two real clients share one OpenClaw home and
    proxy at once; each task gets its own workspace, its own recorded turns, and its row in order."""
    from clawproxy.simulate.agent_tasks import Task
    from tests.bench.util import bench_module

    agent, learn = bench_module("agent"), bench_module("agent_learn")
    proc, port, data = _start(tmp_path, "--upstream", fake_upstream, "--no-train")
    try:
        home = tmp_path / "home"
        cfg_path = learn.write_openclaw_config(home, "measure.json", f"http://127.0.0.1:{port}", "lean", "--no-learn")
        _fake_tool_once(cfg_path)
        tasks = [Task(id=f"t{i}", split="heldout", category="read", prompt=f"What does hello.txt say? ({word})",
                      files={"hello.txt": f"the secret word is {word}\n"}, expect=word, answer=word)
                 for i, word in enumerate(["marmalade", "quince", "damson"])]
        seen: list[int] = []
        rows = agent.run_tasks(tasks, openclaw, home, cfg_path, data / "clawproxy.db", tmp_path / "ws", 300,
                               workers=2, on_row=lambda i, row: seen.append(i))
        assert [r["id"] for r in rows] == ["t0", "t1", "t2"] and sorted(seen) == [1, 2, 3]
        for task, row in zip(tasks, rows, strict=True):
            assert row["status"] == "ok" and row["tool_calls"] == ["read"] and len(row["turn_ids"]) == 2, row
            for t in _query(data, f"SELECT request_messages FROM turns WHERE id IN ({','.join('?' * 2)})",
                            tuple(row["turn_ids"])):
                assert task.prompt in agent.user_text(t["request_messages"])  # the task's own turns, not its neighbour's
        assert len({i for r in rows for i in r["turn_ids"]}) == 6
        assert sorted(p.name for p in (tmp_path / "ws").iterdir()) == ["w0", "w1"]
    finally:
        stop(proc)


def test_memory_flush_and_compaction_turns_are_side_and_never_trained(openclaw, fake_upstream, tmp_path):
    """OpenClaw flushes memory and compacts when the server reports a nearly full context."""
    proc, port, data = _start(tmp_path, "--upstream", fake_upstream, "--no-judge", "--no-train")
    try:
        home = tmp_path / "home"
        # OpenClaw's defaults: its memory plugin runs the pre-compaction flush
        cfg_path = _write_config(home, port, "--upstream", fake_upstream, "--profile", "default")
        cfg = json.loads(cfg_path.read_text())
        cfg["models"]["providers"]["clawproxy"]["headers"] = {"x-fake-prompt-tokens": "7000"}
        cfg_path.write_text(json.dumps(cfg))
        for msg in ("Remember that my cat is called Miso.", "What is my cat called?"):
            openclaw.run(["agent", "--local", "--session-id", "flush-1", "--json", "-m", msg], home,
                         cfg_path)
        side = until_sync(lambda: _query(data, "SELECT side_kind, trainable, reason FROM turns "
                                               "WHERE kind='side'"), "side turns", 30)
        kinds = {t["side_kind"] for t in side}
        assert {"memory_flush", "compaction"} <= kinds, side
        assert all(t["trainable"] == 0 for t in side)
    finally:
        stop(proc)


FACTS = [  # (message, a word every right answer holds)
    ("What is the capital of France?", "paris"),
    ("Thanks, that's right! Which planet is the largest in our solar system?", "jupiter"),
    ("Great. What is the chemical symbol for gold? Answer in one short sentence.", "au"),
]


@dataclass
class DefaultStack:
    port: int
    engine_port: int
    data: Path
    home: Path
    config: Path


@pytest.fixture(scope="module")
def default_stack(openclaw, tmp_path_factory):
    """`clawproxy start` with the default model (Qwen2.5-Coder-1.5B) on vLLM (what engine.kind auto
    picks on a CPU with native bfloat16, named so that the test is the same on every CPU), no
    trainer child, configured only by `openclaw-config --write`. Starting it takes minutes on a
    2-core CPU, under ``_start``'s own deadline, so the tests below share it."""
    tmp_path = tmp_path_factory.mktemp("default-stack")
    with held_port() as engine_port:
        proc, port, data = _start(tmp_path, "--engine", "vllm", "--engine-port", str(engine_port), "--no-train")
    try:
        home = tmp_path / "home"
        yield DefaultStack(port, engine_port, data, home, _write_config(home, port))
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def conversation(openclaw, default_stack) -> list[str]:
    """Three factual questions in one session, each under the client's own deadline; returned once
    the turns are recorded and the two with a next state are judged."""
    s = default_stack
    answers = [openclaw.run(["agent", "--local", "--session-id", "talk-1", "--json", "-m", msg],
                            s.home, s.config)["payloads"][0]["text"] for msg, _ in FACTS]
    turns = until_sync(lambda: (t := _main_turns(s.data)) and len(t) == 3 and t, "three turns", 30)
    for turn in turns[:2]:
        until_sync(lambda turn=turn: _query(s.data, "SELECT 1 FROM judgments WHERE turn_id=?", (turn["id"],)),
                   f"turn {turn['id']} judged", 180)
    return answers


@pytest.fixture(scope="module")
def published(conversation, default_stack) -> dict[str, Any]:
    """One real LoRA step on the judged turns, published into the vLLM that keeps serving (a step of
    the 1.5B takes minutes on this CPU: bench/results/train-memory-1.5b.md), under its own deadline."""
    s = default_stack
    r = subprocess.run([sys.executable, "-m", "clawproxy.cli", "train", "--data-dir", str(s.data),
                        "--steps", "1", "--batch-size", "1", "--engine-url",
                        f"http://127.0.0.1:{s.engine_port}"], capture_output=True, text=True, timeout=1500,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (step,) = _query(s.data, "SELECT * FROM train_steps")
    assert step["status"] == "published", (step, r.stdout[-2000:])
    return step


@pytest.mark.slow
def test_default_stack_is_configured_by_openclaw_config(default_stack):
    s = default_stack
    block = json.loads(s.config.read_text())
    model = block["models"]["providers"]["clawproxy"]["models"][0]
    assert model["id"] == "qwen2.5-coder-1.5b" and model["contextWindow"] == 32768
    assert model["compat"]["supportsTools"] is False  # the chat profile, this model's cap
    # OpenClaw sends no sampling settings: vLLM applies the served directory's generation config,
    # which must hold the publisher's (catalog); vLLM's own log of it is buffered, so not read here
    started = [ln for ln in (s.data / "logs" / "engine.log").read_text().splitlines()
               if "starting vLLM:" in ln][-1]
    served = Path(started.split(" --model ", 1)[1].split(" ", 1)[0])
    gen = json.loads((served / "generation_config.json").read_text())
    assert "--generation-config auto" in started and gen["temperature"] == 0.7 and gen["top_k"] == 20, gen


@pytest.mark.slow
def test_default_stack_holds_a_real_conversation(default_stack, conversation):
    """Answers that stop, most of them right, recorded as linked and judged turns."""
    s = default_stack
    right = [word in text.lower() for (_, word), text in zip(FACTS, conversation, strict=True)]
    assert sum(right) >= 2, conversation

    turns = _main_turns(s.data)
    assert len(turns) == 3 and len({t["session_id"] for t in turns}) == 1
    assert turns[0]["next_turn_id"] == turns[1]["id"] and turns[1]["next_turn_id"] == turns[2]["id"]
    for t in turns:
        assert t["status"] == "ok" and t["finish_reason"] == "stop", t
        assert t["weight_version"] == 0 and t["completion_logprobs"], t
    for t in turns[:2]:  # both have a next state: trainable and judged
        assert t["trainable"] == 1 and t["reason"] == "ok", t
        assert _query(s.data, "SELECT 1 FROM judgments WHERE turn_id=?", (t["id"],)), t


@pytest.mark.slow
# the answer under a new adapter prefills OpenClaw's whole prompt again: over 500 s on an AVX2 CPU
@pytest.mark.timeout(1500)
def test_a_lora_step_is_published_and_the_next_answer_served_by_it(openclaw, default_stack, published):
    """The next answer is recorded under the new weight version."""
    from clawproxy.engine.client import EngineClient

    s = default_stack
    adapters = EngineClient(f"http://127.0.0.1:{s.engine_port}").served_adapters()
    assert adapters == {"clawproxy": str(s.data / "checkpoints" / f"v{published['new_version']}")}

    out = openclaw.run(["agent", "--local", "--session-id", "talk-1", "--json", "-m",
                        "And the capital of Italy?"], s.home, s.config)
    assert out["payloads"][0]["text"].strip(), out
    last = until_sync(lambda: (t := _main_turns(s.data)) and len(t) == 4 and t[-1], "the fourth turn", 30)
    assert last["weight_version"] == published["new_version"] and last["status"] == "ok", last
