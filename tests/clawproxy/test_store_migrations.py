"""A store written by the first schema, holding data, upgrades to the current one intact."""

from __future__ import annotations

import sqlite3

import orjson

from clawproxy.store import MIGRATIONS, Store


def _oldest_store(path) -> None:
    """A database at schema v1 (the first migration alone) with a row in every table it has."""
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0])
    conn.execute("PRAGMA user_version=1")
    conn.execute("INSERT INTO sessions (id, source, first_seen, last_seen) VALUES ('s1', 'header', 1.0, 3.0)")
    turn = ("INSERT INTO turns (id, request_id, session_id, turn_index, created_at, path, kind, status, "
            "finish_reason, request_messages, prompt_token_ids, next_state, trainable, reason) "
            "VALUES (?, ?, 's1', ?, ?, '/v1/chat/completions', ?, 'ok', ?, ?, ?, ?, ?, ?)")
    msgs = orjson.dumps([{"role": "user", "content": "hi"}]).decode()
    answer = orjson.dumps([{"role": "user", "content": "thanks"}]).decode()
    conn.executemany(turn, [
        (1, "r1", 0, 1.0, "main", "stop", msgs, "[1,2,3]", answer, 1, "ok"),
        # a cut-off answer with a next state: judged, and until v5 its reason stayed "truncated"
        (2, "r2", 1, 2.0, "main", "length", msgs, "[4]", answer, 1, "truncated"),
        (3, "r3", 2, 2.5, "side", "stop", msgs, None, None, 0, "side"),
        (4, "r4", 3, 3.0, "main", "stop", msgs, "[5]", None, 0, "pending"),
    ])
    conn.execute("INSERT INTO judgments (turn_id, score, hint, voter, created_at) VALUES (1, 1, 'more', 'lexical', 4.0)")
    conn.execute("INSERT INTO votes (turn_id, idx, voter, raw, score, created_at) VALUES (1, 0, 'lexical', '+1', 1, 4.0)")
    conn.execute("INSERT INTO train_steps (id, created_at, method, base_version, new_version, status, metrics) "
                 "VALUES (1, 5.0, 'rl', 0, 1, 'published', '{\"loss\": 0.5}')")
    conn.execute("INSERT INTO trained_samples (turn_id, step_id) VALUES (1, 1)")
    conn.execute("INSERT INTO checkpoints (version, path, kind, created_at, step_id, status) "
                 "VALUES (1, '/ckpt/v1', 'lora', 5.0, 1, 'published')")
    conn.execute("INSERT INTO events (ts, kind, data) VALUES (5.0, 'publish', '{\"version\": 1}')")
    conn.commit()
    conn.close()


def test_a_store_from_the_oldest_schema_upgrades_with_its_data(tmp_path):
    _oldest_store(tmp_path / "old.db")
    fresh = Store(tmp_path / "fresh.db")
    s = Store(tmp_path / "old.db")
    try:
        assert s.schema_version == len(MIGRATIONS)
        # every table the current schema has, read from a database built by it (not a hand-kept list)
        assert s.tables() == fresh.tables()
        assert {"skipped_samples", "quarantine"} <= set(s.tables())

        # the data survived, and the v5 states hold: a judged turn is exactly one in ok
        assert [(t["id"], t["kind"], t["reason"], t["trainable"]) for t in s.session_turns("s1")] == [
            (1, "main", "ok", 1), (2, "main", "ok", 1), (3, "side", "side", 0), (4, "main", "pending", 0)]
        t1 = s.get_turn(1)
        assert (t1["prompt_token_ids"], t1["next_state"]) == ([1, 2, 3], [{"role": "user", "content": "thanks"}])
        assert s.get_session("s1")["last_seen"] == 3.0
        assert s.judgment_counts() == {1: 1} and s.vote_count() == 1
        assert s.serving_checkpoint()["path"] == "/ckpt/v1" and s.latest_weight_version() == 1
        assert s.training_fate([1, 2]) == {1: {"step": 1, "objective": "", "skipped": None},
                                           2: {"step": None, "objective": None, "skipped": None}}
        assert s.events_of("publish")[0]["data"] == {"version": 1}
        assert s.last_step_losses()["loss"] == 0.5

        # the upgraded store takes every kind of write the current code makes
        assert [t["id"] for t in s.unjudged_turns(10)] == [2]
        assert [c["id"] for c in s.training_candidates(10)] == []  # turn 1 is trained, turn 2 unjudged
        s.record_skipped({2: "truncated"})
        s.quarantine("r9", "bad record", None)
        assert s.skipped_by_reason() == {"truncated": 1} and s.quarantine_count() == 1
        assert s.finalize_idle_sessions(10.0) == ["s1"] and s.get_turn(4)["reason"] == "no_next_state"
    finally:
        s.close()
        fresh.close()


def test_each_migration_applies_on_the_one_before(tmp_path):
    # a store left at any version (an older clawproxy) upgrades from there
    for start in range(1, len(MIGRATIONS)):
        path = tmp_path / f"v{start}.db"
        conn = sqlite3.connect(path)
        for script in MIGRATIONS[:start]:
            conn.executescript(script)
        conn.execute(f"PRAGMA user_version={start}")
        conn.close()
        s = Store(path)
        try:
            assert s.schema_version == len(MIGRATIONS)
        finally:
            s.close()
