"""Training and checkpoints: the trainer's candidates, its steps and the turns each used or skipped,
and the weight versions it published (or rolled back to)."""

from __future__ import annotations

import time
from typing import Any

from clawproxy.store.core import Core, dumps
from clawproxy.store.lifecycle import TRAINABLE_SQL

# The trainer's candidates: judged turns in ok it neither trained on nor skipped yet.
_CANDIDATES = f"""
    FROM turns t JOIN judgments j ON j.turn_id = t.id
    WHERE {TRAINABLE_SQL}
      AND t.id NOT IN (SELECT turn_id FROM trained_samples)
      AND t.id NOT IN (SELECT turn_id FROM skipped_samples)
"""


class Training(Core):
    # -- checkpoints ------------------------------------------------------------------------------
    def serving_checkpoint(self, owner: str | None = None) -> dict[str, Any] | None:
        """The newest published checkpoint of ``owner``'s adapter (None: the shared one, the only
        one with no users): version, path, kind, created_at (when it was published) and gate;
        None: there is none."""
        return self.query_one(
            "SELECT version, path, kind, created_at, gate FROM checkpoints WHERE status='published' "
            "AND user IS ? ORDER BY version DESC LIMIT 1", (owner,)
        )

    def adapter_for(self, user: str | None) -> dict[str, Any] | None:
        """The checkpoint that serves ``user``: their own newest, else the shared one if they share
        (an opted-out user never gets weights trained on others' turns), else None (the base model)."""
        if user is None:
            return self.serving_checkpoint()
        own = self.serving_checkpoint(user)
        if own is not None:
            return own
        row = self.query_one("SELECT shared FROM users WHERE name=?", (user,))
        return self.serving_checkpoint() if row is not None and row["shared"] else None

    def latest_weight_version(self, user: str | None = None) -> int:
        """The version serving ``user`` (``adapter_for``), 0 for the base model."""
        row = self.adapter_for(user)
        return int(row["version"]) if row else 0

    def checkpoint(self, version: int) -> dict[str, Any] | None:
        return self.query_one("SELECT version, path, kind, status FROM checkpoints WHERE version=?", (version,))

    def checkpoints(self) -> list[dict[str, Any]]:
        """Every checkpoint row, oldest first (``gate`` decoded)."""
        return self.query("SELECT version, kind, status, created_at, step_id, gate FROM checkpoints ORDER BY version")

    def max_checkpoint_version(self) -> int:
        """The highest version ever recorded (published, refused or deleted), 0 when none."""
        row = self.query_one("SELECT MAX(version) AS v FROM checkpoints")
        return int(row["v"] or 0) if row else 0

    def published_checkpoints(self) -> list[dict[str, Any]]:
        """Published checkpoints (version, path), newest first."""
        return self.query("SELECT version, path FROM checkpoints WHERE status='published' ORDER BY version DESC")

    def published_before(self, version: int) -> int | None:
        """The newest published version older than ``version``, or None."""
        row = self.query_one(
            "SELECT version FROM checkpoints WHERE status='published' AND version < ? ORDER BY version DESC LIMIT 1",
            (version,),
        )
        return int(row["version"]) if row else None

    def mark_checkpoint_deleted(self, version: int) -> None:
        self.update("checkpoints", "version", version, {"status": "deleted"})

    def record_rollback(self, new_version: int, path: str, kind: str, *, target: int, from_version: int,
                        engine: bool) -> None:
        """One transaction: ``new_version`` serves ``target``'s weights (``path``), and the event."""
        now = time.time()
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO checkpoints (version, path, kind, created_at, step_id, status, gate) "
                "VALUES (?, ?, ?, ?, NULL, 'published', ?)",
                (new_version, path, kind, now, dumps({"rollback_of": target})),
            )
            conn.execute(
                "INSERT INTO events (ts, kind, data) VALUES (?, 'rollback', ?)",
                (now, dumps({"from": from_version, "to": target, "new_version": new_version, "engine": engine})),
            )

    # -- candidates -------------------------------------------------------------------------------
    def training_candidates(self, limit: int) -> list[dict[str, Any]]:
        """The trainer's candidates, oldest first, with their state, score and hint."""
        return self.query(
            "SELECT t.id, t.reason, t.prompt_token_ids, t.completion_token_ids, t.completion_logprobs, "
            "t.finish_reason, t.weight_version, t.request_messages, t.request_tools, t.request_params, "
            f"j.score, j.hint {_CANDIDATES} ORDER BY t.id LIMIT ?",
            (limit,),
        )

    def untrained_judged_count(self) -> int:
        """How many candidates wait (what the trainer's next batch is drawn from, before its own filters)."""
        return self.query_one(f"SELECT COUNT(*) AS n {_CANDIDATES}")["n"]

    # -- steps and the turns they used --------------------------------------------------------------
    def record_skipped(self, skipped: dict[int, str]) -> None:
        """turn id -> reason, in one transaction; a turn already skipped keeps its first reason."""
        now = time.time()
        with self.transaction() as conn:
            conn.executemany(
                "INSERT OR IGNORE INTO skipped_samples (turn_id, reason, created_at) VALUES (?, ?, ?)",
                [(turn_id, reason, now) for turn_id, reason in skipped.items()],
            )

    def record_step(self, *, method: str, base_version: int, new_version: int | None, status: str,
                    metrics: dict[str, Any], kinds: dict[int, str], checkpoint: dict[str, Any] | None = None) -> int:
        """One transaction: the train step, the turns it consumed (turn id -> sample kind) and, when
        ``checkpoint`` (path, kind, gate, engine) is given, the published checkpoint row and its event.
        Returns the step id."""
        now = time.time()
        with self.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO train_steps (created_at, method, base_version, new_version, status, metrics) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (now, method, base_version, new_version, status, dumps(metrics)),
            )
            step_id = int(cur.lastrowid)
            conn.executemany(
                "INSERT OR IGNORE INTO trained_samples (turn_id, step_id, kind) VALUES (?, ?, ?)",
                [(t, step_id, kind) for t, kind in kinds.items()],
            )
            if checkpoint is not None:
                conn.execute(
                    "INSERT INTO checkpoints (version, path, kind, created_at, step_id, status, gate) "
                    "VALUES (?, ?, ?, ?, ?, 'published', ?)",
                    (new_version, checkpoint["path"], checkpoint["kind"], now, step_id, dumps(checkpoint["gate"])),
                )
                conn.execute(
                    "INSERT INTO events (ts, kind, data) VALUES (?, 'publish', ?)",
                    (now, dumps({"version": new_version, "step_id": step_id, "engine": checkpoint["engine"]})),
                )
        return step_id

    def recent_steps(self, limit: int) -> list[dict[str, Any]]:
        """The last ``limit`` train steps (status, base_version), newest first."""
        return self.query("SELECT status, base_version FROM train_steps ORDER BY id DESC LIMIT ?", (limit,))

    def recent_trained_scores(self, limit: int) -> list[int]:
        """Non-zero judge scores of the last ``limit`` turns trained with an RL term, newest first."""
        rows = self.query(
            "SELECT j.score FROM trained_samples ts JOIN judgments j ON j.turn_id = ts.turn_id "
            "WHERE j.score != 0 AND COALESCE(ts.kind, '') != 'opd' ORDER BY ts.step_id DESC, ts.turn_id DESC LIMIT ?",
            (limit,),
        )
        return [int(r["score"]) for r in rows]

    def training_fate(self, turn_ids: list[int]) -> dict[int, dict[str, Any]]:
        """turn id -> what the trainer did with it: step (the train step that used it), kind (the
        sample kind it trained as: rl | rl_opd | opd, '' from before kinds were kept) and skipped
        (the trainer's reason); each None when not so."""
        if not turn_ids:
            return {}
        marks = ", ".join("?" * len(turn_ids))
        out: dict[int, dict[str, Any]] = {t: {"step": None, "kind": None, "skipped": None} for t in turn_ids}
        for r in self.query(f"SELECT turn_id, step_id, COALESCE(kind, '') AS kind FROM trained_samples "
                            f"WHERE turn_id IN ({marks}) ORDER BY step_id DESC", turn_ids):
            out[r["turn_id"]].update(step=r["step_id"], kind=r["kind"])  # the first step wins
        for r in self.query(f"SELECT turn_id, reason FROM skipped_samples WHERE turn_id IN ({marks})", turn_ids):
            out[r["turn_id"]]["skipped"] = r["reason"]
        return out

    def trained_kind(self, turn_id: int) -> str | None:
        """The sample kind ``turn_id`` trained as ('' from before kinds were kept), None: never trained."""
        return self.training_fate([turn_id])[turn_id]["kind"]

    def trained_by_kind(self) -> dict[str, int]:
        """Trained turns counted by sample kind."""
        rows = self.query("SELECT COALESCE(kind, '') AS kind, COUNT(DISTINCT turn_id) AS n FROM trained_samples "
                          "GROUP BY COALESCE(kind, '')")
        return {r["kind"]: r["n"] for r in rows}

    def trained_sample_count(self) -> int:
        return self.query_one("SELECT COUNT(*) AS n FROM trained_samples")["n"]

    def skipped_by_reason(self) -> dict[str, int]:
        return {r["reason"]: r["n"] for r in self.query("SELECT reason, COUNT(*) AS n FROM skipped_samples GROUP BY reason")}

    def step_counts(self) -> dict[str, int]:
        """Train steps by status (published, gate_failed, error, superseded)."""
        return {r["status"]: r["n"] for r in self.query("SELECT status, COUNT(*) AS n FROM train_steps GROUP BY status")}
