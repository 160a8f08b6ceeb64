"""Each user's candidate instructions and preferences, with the evidence for each.

A row is an instruction about style or form that clawproxy may add to a user's prompt: shortlisted
from the generic bank against the user's reactions, said by the user in their own words, or added
by hand. ``status`` moves candidate -> active (the evidence passed the rule in ``judge/trying.py``)
-> demoted (its replies turned bad), or to removed (the user took it away; it is never tried again).
The evidence (tries, good, bad) is counted in the judgment's own transaction
(``Judging.record_judgment``), so a reply is counted once, exactly when it is judged.
"""

from __future__ import annotations

import time
from typing import Any

from clawproxy.store.core import Core

STATUSES = ("candidate", "active", "demoted", "removed")


def where_it_acts(row: dict[str, Any], apply: str) -> str:
    """Where a preference acts now, in words (``trying.apply``): `users show` and the dashboard."""
    if row["status"] == "active":
        if apply == "prompt":
            return "in the prompt"
        if apply == "weights":
            return "in the weights"
        return "in the weights (prompt dropped)" if row["absorbed"] else "in the prompt, being distilled"
    if row["status"] == "candidate":
        return "shortlisted" if row["shortlisted"] else "tried before"
    return row["status"]


def shown_preferences(rows: list[dict[str, Any]], apply: str) -> list[dict[str, Any]]:
    """The rows a person looks at: active, demoted, and candidates shortlisted or tried, with where each acts."""
    return [{**{k: r[k] for k in ("id", "status", "text", "source", "tries", "good", "bad", "leaned_good",
                                  "leaned_bad", "gap", "activated_at")},
             "absorbed": bool(r["absorbed"]), "served": where_it_acts(r, apply)}
            for r in rows if r["status"] in ("active", "demoted") or r["shortlisted"] or r["tries"]]


def count_evidence(conn: Any, turn_id: int, score: int, majority: int | None = None) -> None:
    """Inside the judgment's transaction: a judged reply served under instructions counts for each
    of them, as good or bad, or, when the judge abstained, as leaning the way its majority did (a
    reply that called a tool says nothing about style)."""
    row = conn.execute("SELECT instruction_id, applied_ids, response_tool_calls FROM turns WHERE id=?",
                       (turn_id,)).fetchone()
    if row is None or row["response_tool_calls"] is not None:
        return
    ids = set()
    if row["instruction_id"] is not None:
        ids.add(int(row["instruction_id"]))
    applied = row["applied_ids"]
    if isinstance(applied, str):  # a connection without the row factory's JSON decoding
        import orjson

        applied = orjson.loads(applied)
    ids.update(int(i) for i in applied or ())
    lean = majority if score == 0 and majority is not None else 0
    for pid in ids:
        conn.execute("UPDATE preferences SET tries = tries + 1, good = good + ?, bad = bad + ?, leaned_good = "
                     "leaned_good + ?, leaned_bad = leaned_bad + ?, updated_at = ? WHERE id = ?",
                     (int(score == 1), int(score == -1), int(lean == 1), int(lean == -1), time.time(), pid))


class Preferences(Core):
    def preferences_of(self, user: str | None, statuses: tuple[str, ...] = STATUSES) -> list[dict[str, Any]]:
        """The user's rows in these statuses: active first, then by the shortlist's prior."""
        marks = ", ".join("?" * len(statuses))
        return self.query(
            f"SELECT * FROM preferences WHERE user IS ? AND status IN ({marks}) "
            "ORDER BY status = 'active' DESC, shortlisted DESC, prior DESC, id", (user, *statuses))

    def active_preferences(self, user: str | None) -> list[dict[str, Any]]:
        return self.preferences_of(user, ("active",))

    def serving_preferences(self) -> list[dict[str, Any]]:
        """Every user's active and shortlisted rows: what the proxy may apply or try (read every second)."""
        return self.query(
            "SELECT id, user, text, status, prior, tries, good, bad, leaned_good, leaned_bad, absorbed FROM preferences "
            "WHERE status = 'active' OR (status = 'candidate' AND shortlisted = 1) ORDER BY id")

    def preference(self, pref_id: int) -> dict[str, Any] | None:
        return self.query_one("SELECT * FROM preferences WHERE id=?", (pref_id,))

    def add_preference(self, user: str | None, text: str, source: str, *, status: str = "candidate",
                       prior: float = 0.0, shortlisted: bool = False) -> int:
        """The row for ``(user, text)``: created, or the existing one's id (its evidence kept). A
        manual add makes a removed or demoted one active again."""
        now = time.time()
        with self.transaction() as conn:
            row = conn.execute("SELECT id, status FROM preferences WHERE user IS ? AND text = ?",
                               (user, text)).fetchone()
            if row is not None:
                if status == "active" and row["status"] != "active":
                    conn.execute("UPDATE preferences SET status='active', activated_at=?, updated_at=?, "
                                 "source=? WHERE id=?", (now, now, source, row["id"]))
                return int(row["id"])
            cur = conn.execute(
                "INSERT INTO preferences (user, text, source, status, prior, shortlisted, created_at, "
                "updated_at, activated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (user, text, source, status, prior, int(shortlisted), now, now,
                 now if status == "active" else None))
            return int(cur.lastrowid or 0)

    def set_shortlist(self, user: str | None, items: list[tuple[str, str, float]]) -> None:
        """The user's shortlist is now ``items`` (text, source, prior): those are added or refreshed
        and shortlisted; the user's other candidates leave the shortlist with their evidence kept.
        Removed, demoted and active rows keep their status."""
        now = time.time()
        with self.transaction() as conn:
            conn.execute("UPDATE preferences SET shortlisted = 0 WHERE user IS ? AND status = 'candidate'", (user,))
            for text, source, prior in items:
                row = conn.execute("SELECT id FROM preferences WHERE user IS ? AND text = ?", (user, text)).fetchone()
                if row is None:
                    conn.execute(
                        "INSERT INTO preferences (user, text, source, status, prior, shortlisted, created_at, "
                        "updated_at) VALUES (?, ?, ?, 'candidate', ?, 1, ?, ?)", (user, text, source, prior, now, now))
                else:
                    conn.execute("UPDATE preferences SET shortlisted = 1, prior = ?, updated_at = ? WHERE id = ?",
                                 (prior, now, row["id"]))

    def set_preference_status(self, pref_id: int, status: str) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown preference status {status!r}")
        now = time.time()
        values: dict[str, Any] = {"status": status, "updated_at": now}
        values["absorbed"] = 0  # (re)activated: served in the prompt until the adapter absorbs it again
        if status == "active":
            values["activated_at"] = now  # its demotion window starts here
        self.update("preferences", "id", pref_id, values)

    def set_preference_gap(self, pref_id: int, gap: float, absorbed: bool) -> None:
        self.update("preferences", "id", pref_id, {"gap": gap, "absorbed": int(absorbed), "updated_at": time.time()})

    def served_under(self, pref_id: int, limit: int = 8, since: float | None = None) -> list[dict[str, Any]]:
        """The newest judged replies served with this preference (tried or applied; with ``since``,
        only replies served after that time), newest first: turn_id, role, score, majority, created_at."""
        return self.query(
            "SELECT t.id AS turn_id, t.instruction_role AS role, j.score, j.majority, t.created_at FROM turns t "
            "JOIN judgments j ON j.turn_id = t.id WHERE t.response_tool_calls IS NULL AND t.created_at >= ? AND "
            "(t.instruction_id = ? OR EXISTS (SELECT 1 FROM json_each(t.applied_ids) WHERE value = ?)) "
            "ORDER BY t.id DESC LIMIT ?", (since or 0.0, pref_id, pref_id, limit))

    def answers_under(self, pref_id: int, limit: int = 8, since: float | None = None,
                      tried_only: bool = False) -> list[str]:
        """The newest answers served with this preference (only those it was tried on, with
        ``tried_only``; after ``since``), newest first: what the instruction made of them."""
        role = "AND t.instruction_role = 'try' AND t.instruction_id = ? " if tried_only else (
            "AND (t.instruction_id = ? OR EXISTS (SELECT 1 FROM json_each(t.applied_ids) WHERE value = ?)) ")
        args: tuple[Any, ...] = (since or 0.0, pref_id) if tried_only else (since or 0.0, pref_id, pref_id)
        return [r["response_text"] or "" for r in self.query(
            "SELECT t.response_text FROM turns t WHERE t.response_tool_calls IS NULL AND t.created_at >= ? "
            + role + "ORDER BY t.id DESC LIMIT ?", (*args, limit))]

    def untried_answers(self, user: str | None, score: int, limit: int = 8) -> list[str]:
        """The user's newest untried answers (no instruction, no tool call) judged ``score``, newest first."""
        return [r["response_text"] or "" for r in self.query(
            "SELECT t.response_text FROM turns t JOIN judgments j ON j.turn_id = t.id WHERE t.user IS ? "
            "AND t.kind = 'main' AND t.instruction IS NULL AND t.response_tool_calls IS NULL AND j.score = ? "
            "ORDER BY t.id DESC LIMIT ?", (user, score, limit))]

    def judgment_hints(self, turn_ids: list[int]) -> dict[int, str | None]:
        """turn id -> its judgment's hint (None: no hint), for the judged ones of these turns."""
        if not turn_ids:
            return {}
        return {r["turn_id"]: r["hint"] for r in self.query(
            f"SELECT turn_id, hint FROM judgments WHERE turn_id IN ({', '.join('?' * len(turn_ids))})", turn_ids)}

    def recent_scores(self, user: str | None, limit: int = 4) -> list[dict[str, Any]]:
        """The user's newest judged main turns, newest first: turn_id, score, majority (before the
        judge's threshold), role (try | apply | None)."""
        return self.query(
            "SELECT t.id AS turn_id, j.score, COALESCE(j.majority, j.score) AS majority, t.instruction_role AS role "
            "FROM turns t "
            "JOIN judgments j ON j.turn_id = t.id WHERE t.user IS ? AND t.kind = 'main' "
            "ORDER BY t.id DESC LIMIT ?", (user, limit))

    def untried_scores(self, user: str | None, limit: int) -> list[dict[str, Any]]:
        """The user's newest judged main turns served with no instruction and no tool call, newest
        first: score, majority (what a candidate is compared with)."""
        return self.query(
            "SELECT j.score, COALESCE(j.majority, j.score) AS majority FROM turns t "
            "JOIN judgments j ON j.turn_id = t.id WHERE t.user IS ? AND t.kind = 'main' "
            "AND t.instruction IS NULL AND t.response_tool_calls IS NULL ORDER BY t.id DESC LIMIT ?",
            (user, limit))

    def trying_counts(self, user: str | None) -> dict[str, int]:
        """The user's main turns: all of them (turns), those served under a tried candidate (tried),
        and the tries the budget counts (counted): those judged, and those newer than the user's
        newest judgment (still waiting for a reply); a try never answered (a session's last turn)
        is given back."""
        return self.query_row(
            "SELECT COUNT(*) AS turns, COALESCE(SUM(t.instruction_role = 'try'), 0) AS tried, "
            "COALESCE(SUM(t.instruction_role = 'try' AND (EXISTS (SELECT 1 FROM judgments j WHERE j.turn_id = t.id) "
            "OR t.id > COALESCE((SELECT MAX(j2.turn_id) FROM judgments j2 JOIN turns t2 ON t2.id = j2.turn_id "
            "WHERE t2.user IS ?), 0))), 0) AS counted FROM turns t WHERE t.user IS ? AND t.kind = 'main'",
            (user, user))
