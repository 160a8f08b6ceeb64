"""Read-only views: what `clawproxy stats`, the dashboard (clawproxy/proxy/ui, on a
``Store.reader`` connection) and the simulator's accounting show. Nothing here writes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from clawproxy.store.core import Core

# ``of_user`` in the views below: None is everyone's figures, a name only that user's (their turns,
# their adapter's steps and checkpoints).
_OF_TURN = "(? IS NULL OR t.user = ?)"
_OF_STEP = "(? IS NULL OR user = ?)"


class Views(Core):
    def samples_trained_per_version(self, of_user: str | None = None) -> dict[int, int]:
        """Published version -> turns trained into it."""
        rows = self.query(
            "SELECT s.new_version AS v, COUNT(ts.turn_id) AS n FROM train_steps s "
            "JOIN trained_samples ts ON ts.step_id = s.id JOIN turns t ON t.id = ts.turn_id "
            f"WHERE s.status='published' AND {_OF_TURN} GROUP BY s.new_version", (of_user, of_user)
        )
        return {r["v"]: r["n"] for r in rows}

    def served_turns_per_version(self, of_user: str | None = None) -> list[dict[str, Any]]:
        """Per weight version that served main turns: v, n (turns), judged, mean (score)."""
        return self.query(
            "SELECT t.weight_version AS v, COUNT(*) AS n, COUNT(j.turn_id) AS judged, AVG(j.score) AS mean "
            f"FROM turns t LEFT JOIN judgments j ON j.turn_id = t.id WHERE t.kind='main' AND {_OF_TURN} "
            "GROUP BY t.weight_version", (of_user, of_user)
        )

    def steps_per_base_version(self, of_user: str | None = None) -> list[dict[str, Any]]:
        """Train steps counted by the version they started from and their status: v, status, n."""
        return self.query(
            f"SELECT base_version AS v, status, COUNT(*) AS n FROM train_steps WHERE {_OF_STEP} "
            "GROUP BY base_version, status", (of_user, of_user)
        )

    def gate_failed_steps(self, of_user: str | None = None) -> list[dict[str, Any]]:
        return self.query(
            "SELECT id, base_version, created_at, metrics FROM train_steps WHERE status='gate_failed' "
            f"AND {_OF_STEP} ORDER BY id", (of_user, of_user)
        )

    def checkpoints_of(self, user: str) -> list[dict[str, Any]]:
        """``user``'s own checkpoints and the shared ones that served them, oldest first."""
        return self.query(
            "SELECT version, kind, status, created_at, step_id, gate, user FROM checkpoints WHERE user = ? "
            "OR (user IS NULL AND version IN (SELECT weight_version FROM turns WHERE user = ?)) ORDER BY version",
            (user, user))

    def training_counts_of(self, user: str) -> dict[str, Any]:
        """``user``'s figures beside the versions: steps (their adapter's), trained_by_kind (by sample
        objective; the output keeps its key) and skipped_by_reason (their turns)."""
        steps = self.query_row("SELECT COUNT(*) AS n FROM train_steps WHERE user = ?", (user,))["n"]
        objectives = self.query("SELECT COALESCE(ts.kind, '') AS objective, COUNT(DISTINCT ts.turn_id) AS n "
                           "FROM trained_samples ts JOIN turns t ON t.id = ts.turn_id WHERE t.user = ? "
                           "GROUP BY COALESCE(ts.kind, '')", (user,))
        skipped = self.query("SELECT s.reason, COUNT(*) AS n FROM skipped_samples s JOIN turns t "
                             "ON t.id = s.turn_id WHERE t.user = ? GROUP BY s.reason", (user,))
        return {"steps": steps, "trained_by_kind": {r["objective"]: r["n"] for r in objectives},
                "skipped_by_reason": {r["reason"]: r["n"] for r in skipped}}

    def events_of(self, event_type: str) -> list[dict[str, Any]]:
        """Events of one type (ts, data; the kind column), oldest first."""
        return self.query("SELECT ts, data FROM events WHERE kind=? ORDER BY id", (event_type,))

    def last_step_losses(self) -> dict[str, Any] | None:
        """The newest train step's loss and kl (None where not recorded), or None before any step."""
        return self.query_one(
            "SELECT json_extract(metrics, '$.loss') AS loss, json_extract(metrics, '$.kl') AS kl "
            "FROM train_steps ORDER BY id DESC LIMIT 1"
        )

    def reload_durations(self) -> list[float]:
        """Seconds each published step's checkpoint took to reach the engine (metrics.reload_s)."""
        rows = self.query(
            "SELECT json_extract(metrics, '$.reload_s') AS s FROM train_steps "
            "WHERE status = 'published' AND json_extract(metrics, '$.reload_s') IS NOT NULL"
        )
        return [float(r["s"]) for r in rows]

    def main_turns_scored(self, session_prefix: str) -> list[dict[str, Any]]:
        """Main turns of the sessions whose id starts with ``session_prefix``, by id: id, turn_index,
        trainable, reason, next_state and the judge's score (None when not judged)."""
        return self.query(
            "SELECT t.id, t.turn_index, t.trainable, t.reason, t.next_state, t.created_at, t.instruction, "
            "t.instruction_role, t.applied_ids, j.score FROM turns t "
            "LEFT JOIN judgments j ON j.turn_id = t.id WHERE t.session_id LIKE ? AND t.kind='main' "
            "ORDER BY t.id",
            (session_prefix + "%",),
        )

    def step_figures(self, of_user: str | None = None) -> list[dict[str, Any]]:
        """Every train step of one adapter, oldest first: id, status, created_at and its metrics."""
        return self.query("SELECT id, status, created_at, metrics FROM train_steps WHERE user IS ? ORDER BY id",
                          (of_user,))

    def turns_and_sessions_since(self, since: float) -> dict[str, int]:
        """Turns recorded since ``since`` and the sessions they belong to."""
        return self.query_row(
            "SELECT COUNT(*) AS turns, COUNT(DISTINCT session_id) AS sessions FROM turns WHERE created_at >= ?",
            (since,),
        )

    def last_event(self, event_types: Iterable[str]) -> dict[str, Any] | None:
        """The newest event of one of ``event_types``: id, ts, kind (its type), data."""
        types = list(event_types)
        return self.query_one(
            f"SELECT id, ts, kind, data FROM events WHERE kind IN ({', '.join('?' * len(types))}) "
            "ORDER BY id DESC LIMIT 1",
            types,
        )

    def steps_with_samples(self, of_user: str | None = None) -> list[dict[str, Any]]:
        """Every train step, oldest first: id, created_at, method, status, base/new version, metrics,
        and ``samples``, the turns it trained on."""
        return self.query(
            "SELECT s.id, s.created_at, s.method, s.status, s.base_version, s.new_version, s.metrics, "
            "(SELECT COUNT(*) FROM trained_samples ts WHERE ts.step_id = s.id) AS samples "
            f"FROM train_steps s WHERE {_OF_STEP} ORDER BY s.id", (of_user, of_user)
        )

    def last_step(self) -> dict[str, Any] | None:
        """The newest train step: id, created_at, status, base_version, new_version, metrics."""
        return self.query_one("SELECT id, created_at, status, base_version, new_version, metrics FROM train_steps "
                              "ORDER BY id DESC LIMIT 1")

    def mean_score_over_time(self, bucket_s: float, of_user: str | None = None) -> list[dict[str, Any]]:
        """Mean judge score of main turns per ``bucket_s`` of their recording time: t (bucket start), mean, n."""
        return self.query(
            "SELECT CAST(t.created_at / ? AS INTEGER) * ? AS t, AVG(j.score) AS mean, COUNT(*) AS n "
            f"FROM turns t JOIN judgments j ON j.turn_id = t.id WHERE t.kind='main' AND {_OF_TURN} "
            "GROUP BY 1 ORDER BY 1",
            (bucket_s, bucket_s, of_user, of_user),
        )

    def turns_after(self, after_id: int, limit: int) -> list[dict[str, Any]]:
        """The newest turns recorded after ``after_id`` (at most ``limit``), newest first, in brief:
        id, session_id, created_at, kind, status, trainable, reason, judge score."""
        return self.query(
            "SELECT t.id, t.session_id, t.created_at, t.kind, t.status, t.trainable, t.reason, j.score "
            "FROM turns t LEFT JOIN judgments j ON j.turn_id = t.id WHERE t.id > ? ORDER BY t.id DESC LIMIT ?",
            (after_id, limit),
        )

    def last_ids(self) -> dict[str, int]:
        """The newest turn, train step and judgment ids (0 when none): what changed since a poll."""
        return self.query_row(
            "SELECT COALESCE((SELECT MAX(id) FROM turns), 0) AS turn, COALESCE((SELECT MAX(id) FROM train_steps), 0) AS step, "
            "(SELECT COUNT(*) FROM judgments) AS judged, COALESCE((SELECT MAX(id) FROM events), 0) AS event"
        )
