"""The store across processes: the proxy, judge and trainer open the same database."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from clawproxy.store import MIGRATIONS, Link, Store, TurnState

ROOT = Path(__file__).resolve().parents[2]


def test_processes_opening_a_fresh_store_at_once_all_succeed(tmp_path):
    # Each child imports, says so, and waits for the go on stdin; then all open (and so migrate) one new file.
    for trial in range(3):
        db = tmp_path / f"t{trial}" / "clawproxy.db"
        code = ("import sys; from clawproxy.store import Store; print('ready', flush=True); "
                f"sys.stdin.readline(); Store({str(db)!r}).close()")
        procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
        assert all(p.stdout is not None and p.stdout.readline() == "ready\n" for p in procs)
        for p in procs:  # the go, to all four at once
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        errors = [p.communicate(timeout=60)[1] for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, "\n".join(errors)
        s = Store(db)
        try:
            assert s.schema_version == len(MIGRATIONS)
        finally:
            s.close()


def test_reader_sees_writes_and_cannot_write(tmp_path):
    import sqlite3

    import pytest

    from clawproxy.errors import StoreError

    with pytest.raises(StoreError, match="read-only"):
        Store.reader(tmp_path / "missing.db")
    writer = Store(tmp_path / "s.db")
    reader = Store.reader(tmp_path / "s.db")
    writer.log_event("hello", {"n": 1})
    assert [e["data"] for e in reader.events_of("hello")] == [{"n": 1}]
    with pytest.raises(sqlite3.OperationalError, match="readonly|read-only"):
        reader.log_event("nope")
    writer.close()
    reader.close()


# -- the named methods the recorder, the session tracker and the judge write through --------------
def _turn(request_id: str, **cols):
    return {"request_id": request_id, "created_at": time.time(), "path": "/v1/chat/completions",
            "kind": "main", "status": "ok", "reason": "pending", **cols}


def _session(sid: str, seen_at: float, active: bool = True, **cols):
    return {"id": sid, "source": "header", "session_key": None, "agent": None, "compaction": None,
            "seen_at": seen_at, "active": active, **cols}


def test_record_turn_writes_all_or_nothing(tmp_path):
    import sqlite3

    import pytest

    s = Store(tmp_path / "s.db")
    first = s.record_turn(_turn("r1", session_id="a", turn_index=0, reason="pending"),
                          session=_session("a", 100.0))
    failed = s.record_turn(_turn("r2", session_id="a", turn_index=1, status="error", reason="error", body_hash="h"),
                           session=_session("a", 101.0))
    # the retry of the failed copy, linking the first turn to its next state: one transaction
    third = s.record_turn(_turn("r3", session_id="a", turn_index=2), session=_session("a", 102.0),
                          retried=failed, previous=Link(first, TurnState.OK, [{"role": "user", "content": "ok"}], "user"))
    t1, t2 = s.get_turn(first), s.get_turn(failed)
    assert (t1["next_turn_id"], t1["trainable"], t1["reason"]) == (third, 1, "ok")
    assert (t2["kind"], t2["reason"], t2["trainable"]) == ("retry", "retry", 0)
    assert s.get_session("a")["last_seen"] == 102.0
    # a request id already stored writes nothing, not even the session touch or the link
    assert s.record_turn(_turn("r3", session_id="a"), session=_session("a", 500.0),
                         previous=Link(first, TurnState.NO_NEXT_STATE)) is None
    assert s.get_session("a")["last_seen"] == 102.0 and s.get_turn(first)["reason"] == "ok"
    # a turn the store refuses rolls back the retry mark, the session and the link with it
    b0 = s.record_turn(_turn("r4", session_id="b", turn_index=0), session=_session("b", 200.0))
    b1 = s.record_turn(_turn("r4e", session_id="b", turn_index=1, status="error", reason="error"),
                       session=_session("b", 200.0))
    with pytest.raises(sqlite3.IntegrityError):
        s.record_turn(_turn("r5", session_id="b", turn_index=2, path=None), session=_session("b", 300.0),
                      retried=b1, previous=Link(b0, TurnState.OK, [{"role": "user", "content": "x"}], "user"))
    assert s.get_session("b")["last_seen"] == 200.0
    assert (s.get_turn(b1)["kind"], s.get_turn(b1)["reason"]) == ("main", "error")
    assert s.get_turn(b0)["reason"] == "pending"
    assert not s.has_turn("r5")
    s.close()


def test_side_turns_do_not_touch_the_idle_clock_and_finalizing_ends_pending(tmp_path):
    s = Store(tmp_path / "s.db")
    s.record_turn(_turn("m", session_id="a", turn_index=0, reason="pending"), session=_session("a", 100.0))
    s.record_turn(_turn("hb", session_id="a", turn_index=1, kind="side", reason="side"),
                  session=_session("a", 5000.0, active=False, compaction=3))
    row = s.get_session("a")
    assert (row["last_seen"], row["compaction"]) == (100.0, 3)
    assert s.finalize_idle_sessions(99.0) == []
    assert s.finalize_idle_sessions(101.0) == ["a"]
    assert [t["reason"] for t in s.session_turns("a")] == ["no_next_state", "side"]
    assert s.finalize_idle_sessions(1e12) == []  # finalized once
    # an active turn reopens it
    s.record_turn(_turn("m2", session_id="a", turn_index=2), session=_session("a", 6000.0))
    assert s.get_session("a")["finalized_at"] is None
    s.close()


def test_session_tail_is_the_newest_main_turn_but_the_skipped_one(tmp_path):
    s = Store(tmp_path / "s.db")
    assert s.session_tail("a") == (0, None)
    ok = s.record_turn(_turn("m", session_id="a", turn_index=0, reason="pending",
                             request_messages=[{"role": "user", "content": "hi"}]), session=_session("a", 1.0))
    s.record_turn(_turn("side", session_id="a", turn_index=1, kind="side", reason="side"), session=_session("a", 2.0))
    failed = s.record_turn(_turn("f", session_id="a", turn_index=2, status="error", reason="error"), session=_session("a", 3.0))
    assert s.session_tail("a")[0] == 3
    assert s.session_tail("a")[1]["id"] == failed
    tail = s.session_tail("a", skip=failed)[1]
    assert (tail["id"], tail["status"], tail["answered"], tail["reason"]) == (ok, "ok", 0, "pending")
    assert tail["request_messages"] == [{"role": "user", "content": "hi"}]
    s.close()


def test_open_session_prompts_and_recent_bodies(tmp_path):
    s = Store(tmp_path / "s.db")
    s.record_turn(_turn("a1", session_id="a", turn_index=0, request_messages=[{"role": "user", "content": "1"}],
                        body_hash="h1", created_at=10.0), session=_session("a", 10.0))
    s.record_turn(_turn("a2", session_id="a", turn_index=1, status="error", reason="error", body_hash="h2", created_at=11.0,
                        request_messages=[{"role": "user", "content": "2"}]), session=_session("a", 11.0))
    s.record_turn(_turn("b1", session_id="b", turn_index=0, kind="retry", reason="retry", body_hash="h3", created_at=12.0),
                  session=_session("b", 12.0))
    s.record_turn(_turn("old", session_id="c", turn_index=0, created_at=1.0), session=_session("c", 1.0))
    # the last answered prompt (not the failed one), most recently seen first; "c" was seen too long ago
    assert s.open_session_prompts(5.0, 10) == [("b", None, None), ("a", None, [{"role": "user", "content": "1"}])]
    assert s.open_session_prompts(5.0, 1) == [("b", None, None)]
    assert [r["body_hash"] for r in s.recent_bodies(10.5, 10)] == ["h2"]  # no retries, none older
    assert [r["body_hash"] for r in s.recent_bodies(0.0, 10)] == ["h2", "h1"]
    assert [r["body_hash"] for r in s.recent_bodies(0.0, 2)] == []  # only the last 2 ids are looked at
    s.close()


def test_record_judgment_writes_once_and_replaces_stale_votes(tmp_path):
    s = Store(tmp_path / "s.db")
    tid = s.record_turn(_turn("t", reason="ok", next_state=[{"role": "user", "content": "thanks"}]))
    other = s.record_turn(_turn("u", reason="ok", next_state=[{"role": "user", "content": "no"}]))
    s.record_turn(_turn("v", reason="no_next_state", next_state=[{"role": "user", "content": "x"}]))
    assert s.judge_backlog()["pending"] == 2
    assert [t["id"] for t in s.unjudged_turns(5)] == [tid, other]
    assert [t["id"] for t in s.unjudged_turns(1, exclude={tid})] == [other]
    s.insert("votes", {"turn_id": tid, "idx": 5, "voter": "old", "created_at": 0.0})  # an older writer's
    vote = {"raw": "Score: +1", "score": 1, "hint": None, "error": None}
    assert s.record_judgment(tid, score=1, hint=None, voter="lexical", votes=[vote, vote])
    assert not s.record_judgment(tid, score=-1, hint="no", voter="lexical", votes=[vote])
    assert [(v["idx"], v["voter"]) for v in s.query("SELECT * FROM votes ORDER BY idx")] == [
        (0, "lexical"), (1, "lexical")]
    assert s.judge_backlog()["pending"] == 1
    assert s.query_one("SELECT score FROM judgments WHERE turn_id=?", (tid,))["score"] == 1
    s.close()


def test_quarantine_many_is_one_transaction(tmp_path):
    import sqlite3

    import pytest

    s = Store(tmp_path / "s.db")
    s.quarantine_many([("r1", "x" * 5000, "{}"), (None, "bad", None)])
    assert s.quarantine_count() == 2
    assert len(s.query("SELECT reason FROM quarantine WHERE request_id='r1'")[0]["reason"]) == 2000
    with pytest.raises(sqlite3.Error):
        s.quarantine_many([("r2", "fine", None), ("r3", "no record of this type", object())])
    assert s.quarantine_count() == 2
    s.close()


def test_reader_snapshot_sees_one_state_while_a_writer_commits(tmp_path):
    writer = Store(tmp_path / "s.db")
    reader = Store.reader(tmp_path / "s.db")
    writer.log_event("publish")
    with reader.snapshot():
        assert len(reader.events_of("publish")) == 1
        writer.log_event("publish")  # the writer is not blocked by the reader
        assert len(reader.events_of("publish")) == 1
    assert len(reader.events_of("publish")) == 2
    writer.close()
    reader.close()


def test_list_sessions_counts_and_filters(tmp_path):
    import pytest

    s = Store(tmp_path / "s.db")
    good = s.record_turn(_turn("g", session_id="good", turn_index=0, reason="ok"), session=_session("good", 3.0))
    bad = s.record_turn(_turn("b", session_id="bad", turn_index=0, reason="ok"), session=_session("bad", 2.0))
    s.record_turn(_turn("q", session_id="quiet", turn_index=0, kind="side", reason="side"),
                  session=_session("quiet", 1.0))
    s.add_judgment(good, 1, None, "test")
    s.add_judgment(bad, -1, "no", "test")
    rows = s.list_sessions()
    assert [(r["id"], r["main_turns"], r["side_turns"], r["trainable_turns"], r["judged_turns"]) for r in rows] == [
        ("good", 1, 0, 1, 1), ("bad", 1, 0, 1, 1), ("quiet", 0, 1, 0, 0)]
    assert [r["id"] for r in s.list_sessions(2)] == ["good", "bad"]
    assert [r["id"] for r in s.list_sessions(trainable=False)] == ["quiet"]
    assert [r["id"] for r in s.list_sessions(trainable=True, score="neg")] == ["bad"]
    assert [r["id"] for r in s.list_sessions(score="pos")] == ["good"]
    assert [r["id"] for r in s.list_sessions(score="none")] == ["quiet"]
    with pytest.raises(ValueError, match="pos, neg, zero, none"):
        s.list_sessions(score="great")
    s.close()
