"""A turn's life, and the one place that says why a turn does not train.

A turn's ``reason`` column holds its ``TurnState``. A main turn answered in full waits for the next
request of its session to show what followed (``pending``, or ``truncated`` when the engine cut it
off); then it has a next state (``ok``: the judge scores it and the trainer may take it) or never
gets one (``no_next_state``). Every other state is final from the moment the turn is recorded and
names why it is never judged. ``trainable`` is written with the state (1 exactly in ``ok``) and
is what the judge's and the trainer's queries select on.

Who moves a turn: the recorder's session tracker (``clawproxy/proxy/sessions.py``) sets the first
state and links a next state; the store finalizes idle sessions and marks a failed copy as the
retry of the turn that replaced it. The store checks each move against ``TRANSITIONS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from clawproxy.degenerate import ids_loop, is_degenerate


class TurnState(StrEnum):
    PENDING = "pending"              # waits for its next state
    TRUNCATED = "truncated"          # cut off (finish_reason length), waits for its next state
    OK = "ok"                        # has its next state: judged, then trained or skipped
    NO_NEXT_STATE = "no_next_state"  # its session moved on or went idle without one
    SIDE = "side"                    # OpenClaw's own call (compaction, heartbeat, title...)
    RETRY = "retry"                  # a copy of another turn's request
    ABORTED = "aborted"              # the client or the engine stopped it
    ERROR = "error"                  # the upstream failed or ended oddly
    DEGENERATE = "degenerate"        # the answer loops
    EMPTY = "empty"                  # no text and no tool call
    NOT_LEARNED = "not_learned"      # its client said not to learn from it (LEARN_HEADER: off)


WAITING = frozenset({TurnState.PENDING, TurnState.TRUNCATED})
_FAILED = frozenset({TurnState.SIDE, TurnState.ABORTED, TurnState.ERROR})

# state -> the states it may move to; absent: final.
TRANSITIONS: dict[TurnState, frozenset[TurnState]] = {
    TurnState.PENDING: frozenset({TurnState.OK, TurnState.NO_NEXT_STATE}),
    TurnState.TRUNCATED: frozenset({TurnState.OK, TurnState.NO_NEXT_STATE}),
    # a failed request sent again: the failed copy becomes the retry, the new one is kept
    **{s: frozenset({TurnState.RETRY}) for s in _FAILED},
}


# A request with this header set to "off" is recorded but never judged or trained on (an
# OpenClaw provider's `headers`: conversations kept out of learning, a benchmark's measurements).
LEARN_HEADER = "x-clawproxy-learn"


# "In ok" as the store's queries ask it of a turn row ``t`` (``trainable`` is 1 exactly in ok,
# and indexed with ``kind``): the judge's queue and the trainer's candidates.
TRAINABLE_SQL = "t.trainable = 1 AND t.kind = 'main'"


class IllegalTransition(ValueError):
    """A write would move a turn along no edge of ``TRANSITIONS``: a bug, never the store's fault
    (so the recorder quarantines that record instead of spooling it for a retry)."""


def advance(current: str | None, new: TurnState) -> TurnState:
    """``new`` if a turn in ``current`` may move there; raises ``IllegalTransition`` otherwise."""
    try:
        state = TurnState(current or "")  # a missing state is as unknown as a misspelt one
    except ValueError:
        raise IllegalTransition(f"a turn in the unknown state {current!r} cannot move to {new}") from None
    if new not in TRANSITIONS.get(state, ()):
        raise IllegalTransition(f"a turn cannot move from {state} to {new}")
    return new


def state_columns(state: TurnState) -> dict[str, Any]:
    """The turn columns a state sets: itself, and whether the judge and the trainer take it."""
    return {"reason": state, "trainable": int(state is TurnState.OK)}


def recorded_state(rec: Mapping[str, Any], turn_type: str) -> TurnState:
    """The first state of a recorded turn (``turn_type``: main | side | retry, its kind column)."""
    if turn_type == "side":
        return TurnState.SIDE
    if turn_type == "retry":
        return TurnState.RETRY
    if rec["status"] == "aborted":
        return TurnState.ABORTED
    if rec["status"] != "ok":
        return TurnState.ERROR
    finish = rec.get("finish_reason")
    if finish == "length":
        return TurnState.TRUNCATED
    if finish == "abort":  # the engine cut it short (vLLM's abort; our engine's shutdown)
        return TurnState.ABORTED
    if finish not in ("stop", "tool_calls"):
        return TurnState.ERROR
    if is_degenerate(rec.get("response_text") or ""):
        return TurnState.DEGENERATE
    if not (rec.get("response_text") or "").strip() and not rec.get("response_tool_calls"):
        return TurnState.EMPTY
    if str((rec.get("session_headers") or {}).get(LEARN_HEADER, "")).strip().lower() == "off":
        return TurnState.NOT_LEARNED
    return TurnState.PENDING


def why_not_trained(turn: Mapping[str, Any], *, method: str, max_seq_len: int, max_staleness: int,
                    current_version: int) -> str | None:
    """Why the trainer does not train on ``turn`` (a turn row with its judge ``score`` and
    ``hint``), or None: it trains. The reasons are listed in ``trainer/batch.py``'s docstring.

    The store's candidate query already keeps only judged turns in ``ok``; the first check is that
    query's rule, so a row from anywhere else is answered the same way."""
    if turn.get("reason") != TurnState.OK:
        return str(turn.get("reason") or "unknown")
    if turn.get("score") is None:
        return "unjudged"
    prompt, completion, logps = turn["prompt_token_ids"], turn["completion_token_ids"], turn["completion_logprobs"]
    if not prompt or completion is None or logps is None or len(logps) != len(completion):
        return "missing_token_ids"
    if len(completion) == 0:
        return "empty"
    hint = (turn["hint"] or "").strip()
    if turn.get("finish_reason") == "length" and (method == "rl" or not hint):
        return "truncated"
    if ids_loop(completion):
        return "degenerate"
    if len(prompt) + len(completion) > max_seq_len:
        return "too_long"
    version = turn["weight_version"] or 0
    if version < current_version - max_staleness:
        return "stale"
    score = int(turn["score"])
    if method == "rl" and score == 0:
        return "score_0"
    if method == "opd" and not hint:
        return "no_hint"
    if method == "combined" and score == 0 and not hint:
        return "score_0"
    return None
