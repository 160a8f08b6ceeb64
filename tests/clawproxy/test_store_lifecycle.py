"""A turn's states, the moves between them, and the one answer to why a turn does not train."""

from __future__ import annotations

import time

import pytest

from clawproxy.store import (
    TRANSITIONS,
    IllegalTransition,
    Link,
    Store,
    TurnState,
    advance,
    recorded_state,
    why_not_trained,
)

TRAINER = {"method": "combined", "max_seq_len": 100, "max_staleness": 2, "current_version": 0}


def test_first_states():
    ok = {"status": "ok", "response_text": "fine answer"}
    assert recorded_state({**ok, "finish_reason": "stop"}, "main") == "pending"
    assert recorded_state({**ok, "finish_reason": "length"}, "main") == "truncated"
    # the engine cut the generation short (shutdown, abort-mode pause): not an error of the turn
    assert recorded_state({**ok, "finish_reason": "abort"}, "main") == "aborted"
    assert recorded_state({**ok, "status": "aborted", "finish_reason": None}, "main") == "aborted"
    assert recorded_state({**ok, "status": "error"}, "main") == "error"
    assert recorded_state({**ok, "finish_reason": "stop", "response_text": "ha" * 300}, "main") == "degenerate"
    assert recorded_state({**ok, "finish_reason": "stop", "response_text": " "}, "main") == "empty"
    assert recorded_state({**ok, "finish_reason": "stop", "response_text": "", "response_tool_calls": [{}]},
                          "main") == "pending"
    assert recorded_state(ok, "side") == "side" and recorded_state(ok, "retry") == "retry"


def test_every_move_is_allowed_or_refused_by_the_table():
    for a in TurnState:
        for b in TurnState:
            if b in TRANSITIONS.get(a, ()):
                assert advance(a, b) is b
            else:
                with pytest.raises(IllegalTransition, match=f"from {a} to {b}"):
                    advance(a, b)
    assert not TRANSITIONS.get(TurnState.OK) and not TRANSITIONS.get(TurnState.NO_NEXT_STATE)
    with pytest.raises(IllegalTransition, match="unknown state 'maybe'"):
        advance("maybe", TurnState.OK)
    with pytest.raises(IllegalTransition, match="unknown state None"):
        advance(None, TurnState.OK)


def _turn(s: Store, rid: str, reason: str, *, retried: int | None = None, previous: Link | None = None,
          **cols) -> int:
    session = {"id": "a", "source": "header", "session_key": None, "agent": None, "compaction": None,
               "seen_at": time.time(), "active": True}
    return s.record_turn({"request_id": rid, "created_at": time.time(), "path": "/v1/chat/completions",
                          "kind": "main", "status": "ok", "session_id": "a", "reason": reason, **cols},
                         session=session, retried=retried, previous=previous)


def test_the_store_refuses_an_illegal_move_and_writes_nothing(tmp_path):
    s = Store(tmp_path / "s.db")
    first = _turn(s, "r1", "pending")
    answered = _turn(s, "r2", "pending", previous=Link(first, TurnState.OK, [{"role": "user", "content": "ok"}], "user"))
    assert (s.get_turn(first)["reason"], s.get_turn(first)["trainable"], s.get_turn(first)["next_turn_id"]) == (
        "ok", 1, answered)
    # ok is final: a later request cannot take its next state away, nor make it a retry
    with pytest.raises(IllegalTransition, match="from ok to no_next_state"):
        _turn(s, "r3", "pending", previous=Link(first, TurnState.NO_NEXT_STATE))
    with pytest.raises(IllegalTransition, match="from ok to retry"):
        _turn(s, "r3", "pending", retried=first)
    assert not s.has_turn("r3") and s.get_turn(first)["reason"] == "ok"
    with pytest.raises(ValueError, match="'later'"):
        _turn(s, "r4", "later")  # a first state must be one
    # a turn deleted meanwhile (`sessions delete` from another process) has nothing to move
    gone = _turn(s, "r7", "pending")
    s.execute("DELETE FROM turns WHERE id=?", (gone,))
    assert _turn(s, "r8", "pending", previous=Link(gone, TurnState.NO_NEXT_STATE)) is not None
    # a final turn keeps its state and still gets its next state on record
    empty = _turn(s, "r5", "empty")
    _turn(s, "r6", "pending", previous=Link(empty, None, [{"role": "user", "content": "?"}], "user"))
    assert (s.get_turn(empty)["reason"], s.get_turn(empty)["next_state_role"]) == ("empty", "user")
    s.close()


def test_the_trainer_and_the_store_ask_the_same_question(tmp_path):
    s = Store(tmp_path / "s.db")
    ids = {}
    for name, state in (("ok", "pending"), ("cut", "truncated"), ("gone", "pending")):
        ids[name] = _turn(s, name, state, prompt_token_ids=[1, 2], completion_token_ids=[3, 4],
                          completion_logprobs=[-1.0, -1.0], weight_version=0,
                          finish_reason="length" if name == "cut" else "stop")
    for name in ("ok", "cut"):
        _turn(s, name + "-next", "side", previous=Link(ids[name], TurnState.OK, [{"role": "user", "content": "x"}],
                                                       "user"))
    s.finalize_idle_sessions(time.time() + 1)
    for t in ids.values():
        s.add_judgment(t, 1, None, "test")
    rows = {r["id"]: r for r in s.training_candidates(10)}
    assert sorted(rows) == sorted([ids["ok"], ids["cut"]])  # the unanswered one is no candidate
    assert why_not_trained(rows[ids["ok"]], **TRAINER) is None
    assert why_not_trained(rows[ids["cut"]], **TRAINER) == "truncated"  # no hint: nothing to distil
    assert why_not_trained({**rows[ids["cut"]], "hint": "finish it"}, **TRAINER) is None
    gone = s.get_turn(ids["gone"])
    assert why_not_trained({**gone, "score": 1, "hint": None}, **TRAINER) == "no_next_state"
    s.close()
