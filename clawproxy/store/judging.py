"""Judging: the judge's queue (turns in ``ok`` with no judgment yet), its votes and judgments."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from clawproxy.store.core import Core
from clawproxy.store.lifecycle import TRAINABLE_SQL
from clawproxy.store.preferences import count_evidence

# The judge's queue, oldest first: every turn the judge is yet to score.
_UNJUDGED = f"""
    SELECT t.* FROM turns t
    LEFT JOIN judgments j ON j.turn_id = t.id
    WHERE {TRAINABLE_SQL} AND t.next_state IS NOT NULL AND j.turn_id IS NULL
    ORDER BY t.id
"""


class Judging(Core):
    def unjudged_turns(self, limit: int, exclude: Iterable[int] = ()) -> list[dict[str, Any]]:
        """Up to ``limit`` turns of the judge's queue, oldest first, but those in ``exclude``."""
        exclude = set(exclude)
        rows = self.query(_UNJUDGED + " LIMIT ?", (limit + len(exclude),))
        return [r for r in rows if r["id"] not in exclude][:limit]

    def judge_backlog(self) -> dict[str, Any]:
        """pending: turns in the judge's queue; since: when the oldest of them got its next state
        (its next turn's time), None when none waits; judged: judgments written; last_at: when the
        newest was written (None before any)."""
        return self.query_row(
            "SELECT COUNT(*) AS pending, MIN(COALESCE(nx.created_at, u.created_at)) AS since, "
            "(SELECT COUNT(*) FROM judgments) AS judged, (SELECT MAX(created_at) FROM judgments) AS last_at "
            f"FROM ({_UNJUDGED}) u LEFT JOIN turns nx ON nx.id = u.next_turn_id"
        )

    def record_judgment(self, turn_id: int, *, score: int, hint: str | None, voter: str,
                        votes: list[dict[str, Any]], majority: int | None = None,
                        confidence: float | None = None, reaction: str | None = None,
                        reaction_score: int | None = None) -> bool:
        """One transaction: the votes (raw, score, hint, error), the judgment and, for a scored turn
        the user reacted to, the reaction in the user's memory (with ``reaction_score``, that sign
        even for a turn scored 0); unless already judged (False)."""
        now = time.time()
        with self.transaction() as conn:
            if conn.execute("SELECT 1 FROM judgments WHERE turn_id=?", (turn_id,)).fetchone():
                return False
            # Votes without a judgment can only come from an older writer; this one replaces them.
            conn.execute("DELETE FROM votes WHERE turn_id=?", (turn_id,))
            conn.executemany(
                "INSERT INTO votes (turn_id, idx, voter, raw, score, hint, error, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(turn_id, i, voter, v["raw"], v["score"], v["hint"], v["error"], now)
                 for i, v in enumerate(votes)],
            )
            conn.execute(
                "INSERT INTO judgments (turn_id, score, hint, voter, created_at, majority, confidence) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (turn_id, score, hint, voter, now, score if majority is None else majority, confidence),
            )
            remembered = score if reaction_score is None else reaction_score
            if reaction and remembered != 0:
                conn.execute(
                    "INSERT INTO reactions (turn_id, user, score, text, created_at) "
                    "SELECT id, user, ?, ?, ? FROM turns WHERE id=?", (remembered, reaction, now, turn_id))
            count_evidence(conn, turn_id, score, score if majority is None else majority)
        return True

    def add_judgment(self, turn_id: int, score: int, hint: str | None, voter: str) -> None:
        """A judgment from outside the judge (the simulator's oracle); a turn already judged keeps its own."""
        with self.transaction() as conn:
            cur = conn.execute("INSERT OR IGNORE INTO judgments (turn_id, score, hint, voter, created_at) "
                               "VALUES (?, ?, ?, ?, ?)", (turn_id, score, hint, voter, time.time()))
            if cur.rowcount and score != 0:
                count_evidence(conn, turn_id, score)

    def judge_summary(self, user: str | None = None, *, all_users: bool = True) -> dict[str, int]:
        """Judged turns: judged, scored (+1 or -1), abstained (a majority too unsure to train on),
        neutral (a 0 majority); of one user's turns unless ``all_users``."""
        where, params = ("", ()) if all_users else ("WHERE t.user IS ?", (user,))
        rows = self.query(
            "SELECT COUNT(*) AS judged, COALESCE(SUM(j.score != 0), 0) AS scored, "
            "COALESCE(SUM(j.score = 0 AND COALESCE(j.majority, 0) != 0), 0) AS abstained "
            f"FROM judgments j JOIN turns t ON t.id = j.turn_id {where}", params)
        row = rows[0]  # an aggregate without GROUP BY is always one row
        return {**row, "neutral": row["judged"] - row["scored"] - row["abstained"]}

    def judgment_counts(self) -> dict[int, int]:
        """Judged turns by majority score."""
        return {r["score"]: r["n"] for r in self.query("SELECT score, COUNT(*) AS n FROM judgments GROUP BY score")}

    def votes_of(self, turn_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
        """turn id -> its votes (idx, voter, score, hint, error), in order."""
        out: dict[int, list[dict[str, Any]]] = {t: [] for t in turn_ids}
        for r in self.query(
            f"SELECT turn_id, idx, voter, score, hint, error FROM votes WHERE turn_id IN "
            f"({', '.join('?' * len(turn_ids))}) ORDER BY turn_id, idx",
            turn_ids,
        ):
            out[r["turn_id"]].append(r)
        return out

    def vote_counts(self, after_id: int = 0) -> list[dict[str, Any]]:
        """Votes with an id above ``after_id`` counted by voter and score (None: a failed vote):
        voter, score, n, last_id (the highest id in the group). Ids only grow: counts add up."""
        return self.query(
            "SELECT voter, score, COUNT(*) AS n, MAX(id) AS last_id FROM votes WHERE id > ? GROUP BY voter, score",
            (after_id,),
        )

    def vote_count(self) -> int:
        return self.query_row("SELECT COUNT(*) AS n FROM votes")["n"]
