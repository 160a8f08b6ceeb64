"""The worker over a real SQLite store: idempotent, crash-safe, never double-counts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from clawproxy.store import Store
from judge.voters import LexicalVoter, Vote
from judge.worker import Worker
from tests.judge.conftest import add_turn
from tests.waits import until_sync

ROOT = Path(__file__).resolve().parents[2]


def counts(store: Store) -> tuple[int, int]:
    j = store.query_one("SELECT COUNT(*) AS n FROM judgments")["n"]
    v = store.query_one("SELECT COUNT(*) AS n FROM votes")["n"]
    return j, v


def seed(store: Store) -> dict[str, int]:
    return {
        "good": add_turn(store, "s1", request="capital of Peru?", response="Lima.", next_user="thanks!"),
        "bad": add_turn(store, "s1", request="explain recursion", response="(essay)",
                        next_user="way too long, shorter please"),
        "tool_err": add_turn(store, "s2", request="read conf", response=None, tool_result="Error: ENOENT",
                             tool_calls=[{"id": "c", "function": {"name": "read", "arguments": "{}"}}]),
        "pending": add_turn(store, "s1", request="and Chile?", response="Santiago.", trainable=0),
        "side": add_turn(store, "s3", request="summarize", response="...", next_user="x", turn_type="side",
                         trainable=0),
    }


def test_worker_judges_trainable_turns_once(store):
    ids = seed(store)
    worker = Worker(store, LexicalVoter(), votes=3)
    assert store.judge_backlog()["pending"] == 3
    assert worker.run(follow=False, poll_interval_s=0.01, stop=threading.Event()) == 3
    scores = {r["turn_id"]: r for r in store.query("SELECT * FROM judgments")}
    assert scores[ids["good"]]["score"] == 1
    assert scores[ids["bad"]]["score"] == -1 and "shorter please" in scores[ids["bad"]]["hint"]
    assert scores[ids["tool_err"]]["score"] == -1
    assert ids["pending"] not in scores and ids["side"] not in scores
    votes = store.query("SELECT turn_id, idx, voter, score FROM votes ORDER BY turn_id, idx")
    assert len(votes) == 9 and {v["idx"] for v in votes} == {0, 1, 2}
    # Rerun: nothing left, nothing double-counted.
    assert Worker(store, LexicalVoter(), votes=3).run(False, 0.01, threading.Event()) == 0
    assert counts(store) == (3, 9)
    # A turn that gets its next state later is picked up by the next pass.
    store.update("turns", "id", ids["pending"], {"trainable": 1, "reason": "ok", "next_state_role": "user",
                                                 "next_state": [{"role": "user", "content": "perfect"}]})
    assert worker.run(False, 0.01, threading.Event()) == 1
    assert counts(store) == (4, 12)


class FlakyVoter:
    """Raises on its first call (a crashed vote), then behaves like the lexical voter."""

    name = "flaky"

    def __init__(self, failures: int = 1):
        self.failures = failures
        self.calls = 0
        self.inner = LexicalVoter()

    def vote(self, inp, idx):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("voter crashed")
        return self.inner.vote(inp, idx)


def test_voter_crash_is_retried_not_lost_or_double_counted(store):
    seed(store)
    voter = FlakyVoter(failures=1)
    worker = Worker(store, voter, votes=3, backoff_s=0.01)
    assert worker.run(follow=False, poll_interval_s=0.01, stop=threading.Event()) == 3
    assert counts(store) == (3, 9)
    assert store.query_one("SELECT COUNT(*) AS n FROM votes WHERE error IS NOT NULL")["n"] == 0


def test_voter_that_always_crashes_gives_failed_votes_and_zero(store):
    ids = seed(store)
    worker = Worker(store, FlakyVoter(failures=10**9), votes=3, max_attempts=2, backoff_s=0.01)
    assert worker.run(follow=False, poll_interval_s=0.01, stop=threading.Event()) == 3
    row = store.query_one("SELECT * FROM judgments WHERE turn_id=?", (ids["good"],))
    assert row["score"] == 0  # all votes failed
    failed = store.query("SELECT score, error FROM votes WHERE turn_id=?", (ids["good"],))
    assert len(failed) == 3 and all(v["score"] is None and "crashed" in v["error"] for v in failed)


def test_two_workers_racing_write_each_turn_once(tmp_path):
    path = tmp_path / "clawproxy.db"
    with_store = Store(path)
    for i in range(60):
        add_turn(with_store, f"s{i % 4}", request=f"q{i}", response="a", next_user="thanks")
    stores = [Store(path), Store(path)]
    workers = [Worker(s, LexicalVoter(), votes=3, batch_size=5) for s in stores]
    threads = [threading.Thread(target=w.run, args=(False, 0.01, threading.Event()), name=f"w{i}")
               for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert counts(with_store) == (60, 180)
    assert sum(w.judged for w in workers) == 60
    for s in [*stores, with_store]:
        s.close()


def _cli(data_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "clawproxy.cli", "judge", "run", "--data-dir", str(data_dir),
            "--voter", "lexical", "--no-progress", *args]


def test_killed_worker_resumes_without_loss_or_double_count(tmp_path):
    store = Store(tmp_path / "clawproxy.db")
    total = 1500
    for i in range(total):
        add_turn(store, f"s{i % 10}", request=f"question {i}", response="answer",
                 next_user="thanks!" if i % 3 else "no, that's wrong")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(_cli(tmp_path), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    # checked often: the worker is to be killed mid-run, well before it judges all 1500
    until_sync(lambda: proc.poll() is not None or counts(store)[0] >= 20, "the worker to judge 20 turns", 60,
               poll=0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    j, v = counts(store)
    assert 0 < j < total, "the worker must be killed mid-run for this test to mean anything"
    assert v == 3 * j  # no half-written turn
    done = subprocess.run(_cli(tmp_path), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert counts(store) == (total, 3 * total)
    assert store.query_one("SELECT COUNT(*) AS n FROM (SELECT turn_id FROM votes GROUP BY turn_id "
                           "HAVING COUNT(*) != 3)")["n"] == 0
    store.close()


def test_follow_picks_up_new_turns_and_exits_cleanly_on_sigterm(tmp_path):
    store = Store(tmp_path / "clawproxy.db")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cfg = tmp_path / "judge.yaml"
    cfg.write_text("judge:\n  poll_interval_s: 0.1\n")
    add_turn(store, "s0", request="hello", response="hi!", next_user="thanks")
    proc = subprocess.Popen(_cli(tmp_path, "--follow", "--config", str(cfg)), cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        until_sync(lambda: counts(store)[0] != 0, "the worker up, and through a first pass", 60)
        tid = add_turn(store, "s1", request="hi", response="hello", next_user="perfect, thanks")
        until_sync(lambda: counts(store)[0] != 1, "the worker to judge the new turn", 30)
        assert store.query_one("SELECT score FROM judgments WHERE turn_id=?", (tid,))["score"] == 1
        assert proc.poll() is None  # still following
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "judged 2 turn" in out
    store.close()


def test_votes_are_written_with_raw_output(store):
    seed(store)
    Worker(store, LexicalVoter(), votes=1).run(False, 0.01, threading.Event())
    votes = store.query("SELECT turn_id, raw FROM votes ORDER BY turn_id")
    judged = [r["turn_id"] for r in store.query("SELECT turn_id FROM judgments ORDER BY turn_id")]
    assert len(judged) == 3 and [v["turn_id"] for v in votes] == judged  # one vote per judged turn
    assert all(v["raw"] for v in votes)


def test_failed_vote_objects_count_as_failed():
    from judge.voters import majority

    assert majority([Vote(None, error="x"), Vote(None, error="y")]) == 0


def test_run_command_limit(tmp_path):
    from click.testing import CliRunner

    from clawproxy.cli import main

    store = Store(tmp_path / "clawproxy.db")
    seed(store)
    result = CliRunner().invoke(main, ["judge", "run", "--data-dir", str(tmp_path), "--voter", "lexical",
                                       "--limit", "2", "--votes", "5"])
    assert result.exit_code == 0, result.output
    assert "judged 2 turn(s)" in result.output
    assert counts(store) == (2, 10)
    store.close()
