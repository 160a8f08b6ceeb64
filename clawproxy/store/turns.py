"""Turns and sessions: what the recorder writes (turns, sessions, quarantined records), the session
tracker's reads, each turn's state moves (``lifecycle.py``) and deletion."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from clawproxy.store.core import Core
from clawproxy.store.lifecycle import WAITING, TurnState, advance, state_columns


@dataclass(frozen=True)
class Link:
    """What a new main request tells of its session's previous main turn: the state it moves to
    (None: it stays) and the next state it got (None: none found)."""

    turn_id: int
    state: TurnState | None
    next_state: list[dict[str, Any]] | None = None
    next_state_role: str | None = None


# The ``list_sessions`` score filters: a session's mean judge score.
_MEAN_SCORE = {"pos": "AVG(j.score) > 0", "neg": "AVG(j.score) < 0", "zero": "AVG(j.score) = 0",
               "none": "COUNT(j.turn_id) = 0"}


class Turns(Core):
    # -- reads ------------------------------------------------------------------------------------
    def get_turn(self, turn_id: int) -> dict[str, Any] | None:
        return self.query_one("SELECT * FROM turns WHERE id=?", (turn_id,))

    def has_turn(self, request_id: str) -> bool:
        """Whether a turn with this request id is stored (ingest is idempotent by it)."""
        return self.query_one("SELECT 1 AS x FROM turns WHERE request_id=?", (request_id,)) is not None

    def get_session(self, session_id: str) -> dict[str, Any] | None:
        return self.query_one("SELECT * FROM sessions WHERE id=?", (session_id,))

    def session_turns(self, session_id: str) -> list[dict[str, Any]]:
        """The session's turns in order, each with its judge score and hint."""
        return self.query(
            "SELECT t.*, j.score AS judge_score, j.hint AS judge_hint FROM turns t "
            "LEFT JOIN judgments j ON j.turn_id = t.id WHERE t.session_id=? "
            "ORDER BY t.turn_index, t.id",
            (session_id,),
        )

    def list_sessions(self, limit: int | None = None, *, trainable: bool | None = None,
                      score: str | None = None, user: str | None = None) -> list[dict[str, Any]]:
        """Sessions, newest first, with their turns counted (main, side, retry, trainable, judged)
        and mean judge score. ``trainable``: keep those with (True) or without (False) trainable
        turns; ``score``: keep those whose mean score is pos, neg, zero or none (unjudged);
        ``user``: only that user's."""
        having = []
        if trainable is not None:
            having.append("COALESCE(SUM(t.trainable), 0) > 0" if trainable else "COALESCE(SUM(t.trainable), 0) = 0")
        if score is not None:
            if score not in _MEAN_SCORE:
                raise ValueError(f"score filter {score!r}: use one of {', '.join(_MEAN_SCORE)}")
            having.append(_MEAN_SCORE[score])
        return self.query(
            "SELECT s.*, SUM(t.kind = 'main') AS main_turns, SUM(t.kind = 'side') AS side_turns, "
            "SUM(t.kind = 'retry') AS retry_turns, SUM(t.trainable) AS trainable_turns, "
            "AVG(j.score) AS mean_score, COUNT(j.turn_id) AS judged_turns "
            "FROM sessions s LEFT JOIN turns t ON t.session_id = s.id LEFT JOIN judgments j ON j.turn_id = t.id "
            f"{'WHERE s.user = ? ' if user is not None else ''}"
            f"GROUP BY s.id {'HAVING ' + ' AND '.join(having) if having else ''} "
            "ORDER BY s.last_seen DESC LIMIT ?",
            (*([user] if user is not None else []), limit if limit else -1),
        )

    def session_ids_starting(self, prefix: str, limit: int) -> list[str]:
        """Up to ``limit`` session ids that start with ``prefix`` (taken literally, not as a pattern)."""
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self.query("SELECT id FROM sessions WHERE id LIKE ? ESCAPE '\\' LIMIT ?", (pattern, limit))
        return [r["id"] for r in rows]

    def turns_page(self, session_id: str | None, after_id: int, limit: int) -> list[dict[str, Any]]:
        """Turns (all sessions, or one) with their judge score and hint, by id after ``after_id``:
        pages, since a store can hold more turns than fit in memory."""
        where = "WHERE t.session_id=? AND t.id > ?" if session_id is not None else "WHERE t.id > ?"
        params = [session_id, after_id] if session_id is not None else [after_id]
        return self.query(
            "SELECT t.*, j.score AS judge_score, j.hint AS judge_hint FROM turns t "
            f"LEFT JOIN judgments j ON j.turn_id = t.id {where} ORDER BY t.id LIMIT ?",
            [*params, limit],
        )

    # -- the session tracker (clawproxy/proxy/sessions.py, in the recorder's thread) ----------------
    def open_session_prompts(self, seen_since: float, limit: int) -> list[tuple[str, str | None, Any]]:
        """(session id, its user, last ok main prompt or None) of the ``limit`` open sessions last
        seen since ``seen_since``."""
        # Indexed lookups only: a store of months of traffic must not be scanned at proxy start.
        rows = self.query(
            "SELECT id, user FROM sessions WHERE finalized_at IS NULL AND last_seen >= ? ORDER BY last_seen DESC LIMIT ?",
            (seen_since, limit),
        )
        out = []
        for r in rows:
            last = self.query_one(
                "SELECT request_messages FROM turns WHERE session_id=? AND kind='main' AND status='ok' "
                "ORDER BY turn_index DESC, id DESC LIMIT 1", (r["id"],))
            out.append((r["id"], r["user"], last["request_messages"] if last else None))
        return out

    def last_prompts(self, recent: int) -> list[tuple[int, str | None, Any]]:
        """(turn id, user, request messages) of each user's newest ok main turn among the newest
        ``recent`` turns, newest first: what the engine last served each (the warm-up, proxy/warmup.py)."""
        # the newest ids only: a store of months of traffic is not scanned
        rows = self.query(
            "SELECT MAX(id) AS id FROM turns WHERE id > (SELECT COALESCE(MAX(id), 0) FROM turns) - ? "
            "AND kind='main' AND status='ok' GROUP BY user", (recent,))
        out = []
        for r in sorted(rows, key=lambda r: -r["id"]):
            t = self.query_one("SELECT id, user, request_messages FROM turns WHERE id=?", (r["id"],))
            if t is not None:
                out.append((t["id"], t["user"], t["request_messages"]))
        return out

    def recent_bodies(self, created_since: float, limit: int) -> list[dict[str, Any]]:
        """The retry memory: non-retry turns with a body hash, created since ``created_since``, in the last ``limit`` ids."""
        return self.query(
            "SELECT id, created_at, status, session_id, body_hash, user FROM turns "
            "WHERE id > (SELECT COALESCE(MAX(id), 0) FROM turns) - ? AND body_hash IS NOT NULL "
            "AND created_at >= ? AND kind != 'retry' ORDER BY id DESC",
            (limit, created_since),
        )

    def session_tail(self, session_id: str, *, skip: int | None = None) -> tuple[int, dict[str, Any] | None]:
        """The session's next turn_index, and its newest main turn but ``skip`` (``answered``: it has a next state)."""
        row = self.query_one("SELECT MAX(turn_index) AS n FROM turns WHERE session_id=?", (session_id,))
        newest = self.query_one(
            "SELECT id, request_messages, reason, status, next_state IS NOT NULL AS answered FROM turns "
            "WHERE session_id=? AND kind='main' AND id IS NOT ? ORDER BY turn_index DESC, id DESC LIMIT 1",
            (session_id, skip),
        )
        return (row["n"] + 1 if row and row["n"] is not None else 0), newest

    # -- writes -----------------------------------------------------------------------------------
    def record_turn(self, turn: dict[str, Any], *, session: dict[str, Any] | None = None,
                    retried: int | None = None, previous: Link | None = None) -> int | None:
        """One transaction: mark ``retried`` as a retry, touch ``session``, insert ``turn`` (its
        ``reason`` is its first state), apply ``previous``; None if the request is already stored.
        A state move ``TRANSITIONS`` does not allow raises ``IllegalTransition`` and writes nothing."""
        turn = {**turn, **state_columns(TurnState(turn["reason"]))}
        with self.transaction():
            if self.has_turn(turn["request_id"]):
                return None
            if retried is not None:
                self._move(retried, TurnState.RETRY, kind="retry")
            if session is not None:
                self._touch_session(**session)
            turn_id = self.insert("turns", turn)
            if previous is not None:
                values: dict[str, Any] = {}
                if previous.next_state is not None:
                    values = {"next_state": previous.next_state, "next_state_role": previous.next_state_role,
                              "next_turn_id": turn_id}
                if previous.state is not None:
                    self._move(previous.turn_id, previous.state, **values)
                else:
                    self.update("turns", "id", previous.turn_id, values)
        return turn_id

    def _move(self, turn_id: int, state: TurnState, **values: Any) -> None:
        """Move a turn to ``state`` (checked against its current one), with other columns."""
        row = self.query_one("SELECT reason FROM turns WHERE id=?", (turn_id,))
        if row is None:  # deleted meanwhile (`clawproxy sessions delete`): nothing left to move
            return
        self.update("turns", "id", turn_id, {**values, **state_columns(advance(row["reason"], state))})

    def _touch_session(self, *, id: str, source: str, session_key: str | None, agent: str | None,
                       compaction: int | None, seen_at: float, active: bool, user: str | None = None) -> None:
        """Create or touch a session; only ``active`` (non-side) turns move its idle clock and reopen it."""
        self.execute(
            "INSERT INTO sessions (id, source, session_key, agent, compaction, first_seen, last_seen, user) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "last_seen=CASE WHEN ? THEN MAX(last_seen, excluded.last_seen) ELSE last_seen END, "
            "finalized_at=CASE WHEN ? THEN NULL ELSE finalized_at END, "
            "compaction=COALESCE(excluded.compaction, compaction), "
            "session_key=COALESCE(session_key, excluded.session_key), "
            "agent=COALESCE(agent, excluded.agent)",
            (id, source, session_key, agent, compaction, seen_at, seen_at, user, active, active),
        )

    def finalize_idle_sessions(self, seen_before: float) -> list[str]:
        """One transaction: finalize the open sessions last seen before ``seen_before``; their
        waiting turns move to ``no_next_state``."""
        waiting = sorted(WAITING)
        with self.transaction() as conn:
            ids = [r["id"] for r in conn.execute(
                "SELECT id FROM sessions WHERE finalized_at IS NULL AND last_seen < ?", (seen_before,))]
            for sid in ids:
                # every waiting state may move to no_next_state (TRANSITIONS), so no row is checked
                conn.execute(f"UPDATE turns SET reason=?, trainable=0 WHERE session_id=? "
                             f"AND reason IN ({', '.join('?' * len(waiting))})",
                             (TurnState.NO_NEXT_STATE, sid, *waiting))
                conn.execute("UPDATE sessions SET finalized_at=? WHERE id=?", (time.time(), sid))
        return ids

    # -- records the recorder could not store (clawproxy/proxy/recorder.py) --------------------------
    def quarantine(self, request_id: str | None, reason: str, record: str | None) -> None:
        """Keep one record aside with the reason it could not be stored."""
        self.quarantine_many([(request_id, reason, record)])

    def quarantine_many(self, records: Iterable[tuple[str | None, str, str | None]]) -> None:
        """(request_id, reason, record) rows, all or none in one transaction."""
        now = time.time()
        with self.transaction() as conn:
            conn.executemany(
                "INSERT INTO quarantine (request_id, created_at, reason, record) VALUES (?, ?, ?, ?)",
                [(request_id, now, reason[:2000], record) for request_id, reason, record in records],
            )

    def quarantine_count(self) -> int:
        """How many records are quarantined."""
        return self.query_row("SELECT COUNT(*) AS n FROM quarantine")["n"]

    # -- deletion (`clawproxy sessions delete`) -------------------------------------------------------
    def delete_session(self, session_id: str) -> int:
        with self.transaction() as conn:
            n = conn.execute("DELETE FROM turns WHERE session_id=?", (session_id,)).rowcount
            conn.execute("DELETE FROM sessions WHERE id=?", (session_id,))
        return n

    def delete_all(self) -> int:
        with self.transaction() as conn:
            n = conn.execute("DELETE FROM turns").rowcount
            conn.execute("DELETE FROM sessions")
            conn.execute("DELETE FROM quarantine")
        return n
