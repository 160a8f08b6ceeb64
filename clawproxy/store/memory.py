"""Each user's memory: what they said about the answers, in their own words.

A row is written with the judgment of a turn the user reacted to (``Judging.record_judgment``), from
the next state the recorder stored, so it is redacted like everything else. It belongs to its turn:
deleting the turn, its session or its user deletes it (``ON DELETE CASCADE``). It holds no list of
known preferences, only what was said, so it serves a wish no one here thought of.
"""

from __future__ import annotations

from typing import Any

from clawproxy.store.core import Core


class Memory(Core):
    def reactions_of(self, user: str | None, limit: int = 50, score: int | None = None,
                     before_turn: int | None = None) -> list[dict[str, Any]]:
        """The user's newest reactions first: turn_id, score, text, created_at, and the request
        messages and response text of the turn they reacted to. ``score`` keeps one sign;
        ``before_turn`` keeps those recorded before that turn (what was known when it was served)."""
        where: list[str] = ["r.user IS ?"]
        params: list[Any] = [user]
        if score is not None:
            where.append("r.score = ?")
            params.append(score)
        if before_turn is not None:
            where.append("r.turn_id < ?")
            params.append(before_turn)
        return self.query(
            "SELECT r.turn_id, r.score, r.text, r.created_at, t.session_id, t.request_messages, "
            "t.response_text FROM reactions r JOIN turns t ON t.id = r.turn_id "
            f"WHERE {' AND '.join(where)} ORDER BY r.turn_id DESC LIMIT ?", (*params, limit))

    def reaction_counts(self, user: str | None) -> dict[int, int]:
        """The user's reactions by score (+1 praised, -1 complained about)."""
        return {r["score"]: r["n"] for r in self.query(
            "SELECT score, COUNT(*) AS n FROM reactions WHERE user IS ? GROUP BY score", (user,))}
