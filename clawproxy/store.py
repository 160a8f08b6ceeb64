"""The store: one SQLite database (WAL) under the data dir, with versioned migrations.

Created with owner-only permissions (dir 0700, files 0600) and never wiped on start. JSON columns
hold orjson-encoded text. ``Store`` is thread-safe (one connection guarded by a lock); async code
calls it from a worker thread (the proxy's recorder owns one), never from the event loop.

Tables
- sessions     one row per OpenClaw session (id from the affinity header, Runtime line, ...)
- turns        one row per recorded /v1/chat/completions call, with request, response, sampled
               token ids and log-probs, timings, kind, trainable + reason, next state
- judgments    final judge score and hint per turn;   votes: every vote behind it
- train_steps  one row per optimizer step with its metrics;   trained_samples: which turns it used
- checkpoints  published (or refused) weight versions;   events: gate failures, rollbacks, ...
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from clawproxy.errors import StoreError

# Each entry migrates from version i to i+1. Append only; never edit a released migration.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE sessions (
        id            TEXT PRIMARY KEY,
        source        TEXT NOT NULL,          -- header | prompt_cache_key | x-session-id | runtime | prefix | new
        session_key   TEXT,                   -- OpenClaw's sessionKey (agent:main:main) when known
        agent         TEXT,
        compaction    INTEGER,                -- last seen :<compactionCount>
        first_seen    REAL NOT NULL,
        last_seen     REAL NOT NULL,
        finalized_at  REAL                    -- set when idle longer than sessions.idle_timeout_s
    );
    CREATE TABLE turns (
        id                    INTEGER PRIMARY KEY AUTOINCREMENT,
        request_id            TEXT UNIQUE NOT NULL,
        session_id            TEXT REFERENCES sessions(id) ON DELETE CASCADE,
        turn_index            INTEGER,        -- order within the session
        created_at            REAL NOT NULL,
        path                  TEXT NOT NULL,
        kind                  TEXT NOT NULL,  -- main | side | retry
        side_kind             TEXT,           -- compaction | heartbeat | memory_flush | title | recall | probe | ...
        status                TEXT NOT NULL,  -- ok | error | aborted
        http_status           INTEGER,
        error                 TEXT,
        compaction            INTEGER,
        model                 TEXT,
        stream                INTEGER NOT NULL DEFAULT 0,
        request_messages      TEXT,           -- JSON, exactly as sent (incl. transient context)
        request_tools         TEXT,           -- JSON
        request_params        TEXT,           -- JSON: sampling params and other body fields
        body_hash             TEXT,           -- for retry detection
        response_text         TEXT,
        response_reasoning    TEXT,
        response_tool_calls   TEXT,           -- JSON, reassembled from deltas
        finish_reason         TEXT,
        usage                 TEXT,           -- JSON
        prompt_token_ids      TEXT,           -- JSON list[int], from the engine
        completion_token_ids  TEXT,           -- JSON list[int], what was sampled
        completion_logprobs   TEXT,           -- JSON list[float], behaviour log-probs
        weight_version        INTEGER,        -- version at the first token
        weight_versions       TEXT,           -- JSON list of versions seen during generation
        ttft_ms               REAL,
        total_ms              REAL,
        next_state            TEXT,           -- JSON list of messages after this turn
        next_state_role       TEXT,           -- user | tool
        next_turn_id          INTEGER,
        trainable             INTEGER NOT NULL DEFAULT 0,
        reason                TEXT            -- why (not) trainable
    );
    CREATE INDEX turns_session ON turns(session_id, turn_index);
    CREATE INDEX turns_trainable ON turns(trainable, kind);
    CREATE TABLE judgments (
        turn_id     INTEGER PRIMARY KEY REFERENCES turns(id) ON DELETE CASCADE,
        score       INTEGER NOT NULL,        -- +1 / 0 / -1
        hint        TEXT,
        voter       TEXT NOT NULL,
        created_at  REAL NOT NULL
    );
    CREATE TABLE votes (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        turn_id     INTEGER NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
        idx         INTEGER NOT NULL,
        voter       TEXT NOT NULL,
        raw         TEXT,
        score       INTEGER,                 -- NULL: failed vote
        hint        TEXT,
        error       TEXT,
        created_at  REAL NOT NULL,
        UNIQUE(turn_id, idx)
    );
    CREATE TABLE train_steps (
        id              INTEGER PRIMARY KEY AUTOINCREMENT,
        created_at      REAL NOT NULL,
        method          TEXT NOT NULL,
        base_version    INTEGER,
        new_version     INTEGER,             -- NULL if not published
        status          TEXT NOT NULL,       -- published | gate_failed | error
        metrics         TEXT                 -- JSON: loss, adv, clip frac, kl, grad norm, tok/s, skipped...
    );
    CREATE TABLE trained_samples (
        turn_id   INTEGER NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
        step_id   INTEGER NOT NULL REFERENCES train_steps(id) ON DELETE CASCADE,
        PRIMARY KEY (turn_id, step_id)
    );
    CREATE TABLE checkpoints (
        version       INTEGER PRIMARY KEY,
        path          TEXT NOT NULL,
        kind          TEXT NOT NULL,         -- full | lora
        created_at    REAL NOT NULL,
        step_id       INTEGER,
        status        TEXT NOT NULL,         -- published | refused | deleted
        gate          TEXT                   -- JSON gate report
    );
    CREATE TABLE events (
        id     INTEGER PRIMARY KEY AUTOINCREMENT,
        ts     REAL NOT NULL,
        kind   TEXT NOT NULL,                -- gate_failed | rollback | reload | trainer_error | ...
        data   TEXT
    );
    """,
    # v2 (trainer): turns the trainer looked at and will never train on, with the reason, so each is
    # counted once in the skipped-by-reason metrics and not re-examined on every poll.
    """
    CREATE TABLE skipped_samples (
        turn_id     INTEGER PRIMARY KEY REFERENCES turns(id) ON DELETE CASCADE,
        reason      TEXT NOT NULL,           -- stale | score_0 | no_hint | truncated | degenerate | empty | missing_token_ids | too_long
        created_at  REAL NOT NULL
    );
    """,
    # v3 (proxy): turns the recorder could not store (a field of a type no column takes, a body
    # nested too deep...), kept alone with the reason instead of blocking the turns behind them.
    """
    CREATE TABLE quarantine (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        request_id  TEXT,
        created_at  REAL NOT NULL,
        reason      TEXT NOT NULL,
        record      TEXT                     -- the record as JSON (redacted), or the raw turn as text
    );
    """,
    # v4 (trainer): which loss terms each trained turn got (rl | rl_opd | opd), so a run can count
    # its distillation-only samples and keep their scores out of the RL baseline.
    """
    ALTER TABLE trained_samples ADD COLUMN kind TEXT;
    """,
]

JSON_COLUMNS = {
    "request_messages", "request_tools", "request_params", "response_tool_calls", "usage",
    "prompt_token_ids", "completion_token_ids", "completion_logprobs", "weight_versions",
    "next_state", "metrics", "gate", "data",
}


def dumps(value: Any) -> str | None:
    if value is None:
        return None
    return orjson.dumps(value).decode()


def loads(value: str | bytes | None) -> Any:
    if value is None:
        return None
    return orjson.loads(value)


def _row(cursor: sqlite3.Cursor, row: tuple) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for (name, *_), value in zip(cursor.description, row, strict=True):
        out[name] = loads(value) if name in JSON_COLUMNS and isinstance(value, str) else value
    return out


class Store:
    """The SQLite store. Open with ``Store(path)``; it creates and migrates the database.

    ``Store.reader(path)`` opens an existing store read-only, for observers (the dashboard,
    /metrics) that must never take a write lock from the recorder, the judge or the trainer.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.RLock()
        self.readonly = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.path.parent, 0o700)
            old_umask = os.umask(0o077)
            try:
                self._conn = sqlite3.connect(
                    self.path, check_same_thread=False, timeout=30.0, isolation_level=None
                )
            finally:
                os.umask(old_umask)
            self._conn.row_factory = _row
            self._enable_wal()
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            # Deleted rows are overwritten with zeros, not left in free pages (sessions delete).
            self._conn.execute("PRAGMA secure_delete=ON")
            self._conn.execute("PRAGMA busy_timeout=30000")
            self._migrate()
            for suffix in ("", "-wal", "-shm"):
                p = Path(str(self.path) + suffix)
                if p.exists():
                    os.chmod(p, 0o600)
        except (sqlite3.Error, OSError) as e:  # OSError: the data dir cannot be created or chmod-ed
            raise StoreError(f"cannot open store {self.path}: {e}") from e

    @classmethod
    def reader(cls, path: str | Path) -> Store:
        """A read-only connection to an existing, migrated store (no migration, no writes)."""
        self = cls.__new__(cls)
        self.path, self._lock, self.readonly = Path(path), threading.RLock(), True
        try:
            self._conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                         check_same_thread=False, timeout=30.0, isolation_level=None)
            self._conn.row_factory = _row
            self._conn.execute("PRAGMA query_only=ON")
            self._conn.execute("PRAGMA busy_timeout=30000")
            if self._check_version() != len(MIGRATIONS):
                raise StoreError(f"store {self.path} is not migrated yet; start clawproxy first.")
        except sqlite3.Error as e:
            raise StoreError(f"cannot open store {self.path} read-only: {e}") from e
        return self

    # -- plumbing ---------------------------------------------------------------------------
    def _enable_wal(self) -> None:
        # Switching a new file to WAL takes an exclusive lock, and SQLite answers "database is
        # locked" at once (the busy handler is not consulted) when another process switches it at
        # the same moment, as the proxy, judge and trainer do on a first start. Retry briefly.
        deadline = time.monotonic() + 30.0
        while True:
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _migrate(self) -> None:
        with self._lock:
            version = self._check_version()
            if version == len(MIGRATIONS):
                return
            # The proxy, judge and trainer processes may open a fresh store at the same moment:
            # take the write lock, then read the version again, so only one of them migrates.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                version = self._check_version()
                for i in range(version, len(MIGRATIONS)):
                    for stmt in _split_sql(MIGRATIONS[i]):
                        self._conn.execute(stmt)
                    self._conn.execute(f"PRAGMA user_version={i + 1}")
                self._conn.execute("COMMIT")
            except Exception:
                self._conn.execute("ROLLBACK")
                raise

    def _check_version(self) -> int:
        version = self._conn.execute("PRAGMA user_version").fetchone()["user_version"]
        if version > len(MIGRATIONS):
            raise StoreError(
                f"store {self.path} has schema v{version}, newer than this clawproxy "
                f"(v{len(MIGRATIONS)}); upgrade clawproxy."
            )
        return version

    @property
    def schema_version(self) -> int:
        return self.query_one("PRAGMA user_version")["user_version"]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                # SQLite rolls back by itself on some errors (a full disk, I/O): a second
                # rollback would then raise "no transaction is active" and hide the real error.
                if self._conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                raise

    def execute(self, sql: str, params: Iterable[Any] | dict[str, Any] = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._conn.execute(sql, params)

    def query(self, sql: str, params: Iterable[Any] | dict[str, Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def query_one(self, sql: str, params: Iterable[Any] | dict[str, Any] = ()) -> dict[str, Any] | None:
        with self._lock:
            return self._conn.execute(sql, params).fetchone()

    # -- generic row helpers -----------------------------------------------------------------
    def insert(self, table: str, values: dict[str, Any], *, or_ignore: bool = False) -> int:
        cols = list(values)
        vals = [dumps(values[c]) if c in JSON_COLUMNS else values[c] for c in cols]
        verb = "INSERT OR IGNORE" if or_ignore else "INSERT"
        sql = f"{verb} INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        with self._lock:
            return self._conn.execute(sql, vals).lastrowid

    def update(self, table: str, key: str, key_value: Any, values: dict[str, Any]) -> None:
        if not values:
            return
        cols = list(values)
        vals = [dumps(values[c]) if c in JSON_COLUMNS else values[c] for c in cols]
        sql = f"UPDATE {table} SET {', '.join(f'{c}=?' for c in cols)} WHERE {key}=?"
        with self._lock:
            self._conn.execute(sql, [*vals, key_value])

    def log_event(self, kind: str, data: dict[str, Any] | None = None) -> None:
        self.insert("events", {"ts": time.time(), "kind": kind, "data": data})

    # -- reads used across components ----------------------------------------------------------
    def get_turn(self, turn_id: int) -> dict[str, Any] | None:
        return self.query_one("SELECT * FROM turns WHERE id=?", (turn_id,))

    def session_turns(self, session_id: str) -> list[dict[str, Any]]:
        return self.query(
            "SELECT t.*, j.score AS judge_score, j.hint AS judge_hint FROM turns t "
            "LEFT JOIN judgments j ON j.turn_id = t.id WHERE t.session_id=? "
            "ORDER BY t.turn_index, t.id",
            (session_id,),
        )

    def list_sessions(self, limit: int | None = None) -> list[dict[str, Any]]:
        sql = """
            SELECT s.*,
                   SUM(t.kind = 'main') AS main_turns,
                   SUM(t.kind = 'side') AS side_turns,
                   SUM(t.kind = 'retry') AS retry_turns,
                   SUM(t.trainable) AS trainable_turns,
                   AVG(j.score) AS mean_score,
                   COUNT(j.turn_id) AS judged_turns
            FROM sessions s
            LEFT JOIN turns t ON t.session_id = s.id
            LEFT JOIN judgments j ON j.turn_id = t.id
            GROUP BY s.id ORDER BY s.last_seen DESC
        """
        if limit:
            sql += f" LIMIT {int(limit)}"
        return self.query(sql)

    def latest_weight_version(self) -> int:
        row = self.query_one("SELECT MAX(version) AS v FROM checkpoints WHERE status='published'")
        return int(row["v"]) if row and row["v"] is not None else 0

    # -- the recorder (clawproxy/proxy/recorder.py): records it could not store ------------------
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
        return self.query_one("SELECT COUNT(*) AS n FROM quarantine")["n"]

    # -- session tracking (clawproxy/proxy/sessions.py, in the recorder's thread) ----------------
    def has_turn(self, request_id: str) -> bool:
        """Whether a turn with this request id is stored (ingest is idempotent by it)."""
        return self.query_one("SELECT 1 AS x FROM turns WHERE request_id=?", (request_id,)) is not None

    def open_session_prompts(self, seen_since: float, limit: int) -> list[tuple[str, Any]]:
        """(session id, last ok main prompt or None) of the ``limit`` open sessions last seen since ``seen_since``."""
        # Indexed lookups only: a store of months of traffic must not be scanned at proxy start.
        rows = self.query(
            "SELECT id FROM sessions WHERE finalized_at IS NULL AND last_seen >= ? ORDER BY last_seen DESC LIMIT ?",
            (seen_since, limit),
        )
        out = []
        for r in rows:
            last = self.query_one(
                "SELECT request_messages FROM turns WHERE session_id=? AND kind='main' AND status='ok' "
                "ORDER BY turn_index DESC, id DESC LIMIT 1", (r["id"],))
            out.append((r["id"], last["request_messages"] if last else None))
        return out

    def recent_bodies(self, created_since: float, limit: int) -> list[dict[str, Any]]:
        """The retry memory: non-retry turns with a body hash, created since ``created_since``, in the last ``limit`` ids."""
        return self.query(
            "SELECT id, created_at, status, session_id, body_hash FROM turns "
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

    def record_turn(self, turn: dict[str, Any], *, session: dict[str, Any] | None = None,
                    retried: int | None = None, previous: tuple[int, dict[str, Any]] | None = None) -> int | None:
        """One transaction: mark ``retried``, touch ``session``, insert ``turn``, update (and link) ``previous``; None if stored."""
        with self.transaction():
            if self.has_turn(turn["request_id"]):
                return None
            if retried is not None:
                self.update("turns", "id", retried, {"kind": "retry", "reason": "retry", "trainable": 0})
            if session is not None:
                self._touch_session(**session)
            turn_id = self.insert("turns", turn)
            if previous is not None:
                prev_id, values = previous
                if "next_state" in values:
                    values = {**values, "next_turn_id": turn_id}
                self.update("turns", "id", prev_id, values)
        return turn_id

    def _touch_session(self, *, id: str, source: str, session_key: str | None, agent: str | None,
                       compaction: int | None, seen_at: float, active: bool) -> None:
        """Create or touch a session; only ``active`` (non-side) turns move its idle clock and reopen it."""
        self.execute(
            "INSERT INTO sessions (id, source, session_key, agent, compaction, first_seen, last_seen) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "last_seen=CASE WHEN ? THEN MAX(last_seen, excluded.last_seen) ELSE last_seen END, "
            "finalized_at=CASE WHEN ? THEN NULL ELSE finalized_at END, "
            "compaction=COALESCE(excluded.compaction, compaction), "
            "session_key=COALESCE(session_key, excluded.session_key), "
            "agent=COALESCE(agent, excluded.agent)",
            (id, source, session_key, agent, compaction, seen_at, seen_at, active, active),
        )

    def finalize_idle_sessions(self, seen_before: float) -> list[str]:
        """One transaction: finalize the open sessions last seen before ``seen_before``; pending turns become no_next_state."""
        with self.transaction() as conn:
            ids = [r["id"] for r in conn.execute(
                "SELECT id FROM sessions WHERE finalized_at IS NULL AND last_seen < ?", (seen_before,))]
            for sid in ids:
                conn.execute("UPDATE turns SET reason='no_next_state' WHERE session_id=? AND reason='pending'",
                             (sid,))
                conn.execute("UPDATE sessions SET finalized_at=? WHERE id=?", (time.time(), sid))
        return ids

    # -- the judge (judge/worker.py) -------------------------------------------------------------
    def unjudged_count(self) -> int:
        """How many turns wait for the judge (see ``unjudged_turns``)."""
        return self.query_one(f"SELECT COUNT(*) AS n FROM ({_UNJUDGED})")["n"]

    def unjudged_turns(self, limit: int, exclude: Iterable[int] = ()) -> list[dict[str, Any]]:
        """Up to ``limit`` turns of the judge's queue (``_UNJUDGED``), oldest first, but those in ``exclude``."""
        exclude = set(exclude)
        rows = self.query(_UNJUDGED + " LIMIT ?", (limit + len(exclude),))
        return [r for r in rows if r["id"] not in exclude][:limit]

    def record_judgment(self, turn_id: int, *, score: int, hint: str | None, voter: str,
                        votes: list[dict[str, Any]]) -> bool:
        """One transaction: the votes (raw, score, hint, error) and the judgment, unless already judged (False)."""
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
                "INSERT INTO judgments (turn_id, score, hint, voter, created_at) VALUES (?, ?, ?, ?, ?)",
                (turn_id, score, hint, voter, now),
            )
        return True

    # -- deletion (`clawproxy sessions delete`) ----------------------------------------------------
    def purge_free_pages(self) -> None:
        """Rewrite the database without its free pages and empty the WAL, so deleted rows are
        gone from every file on disk (used after deletions; needs a moment with no writer)."""
        with self._lock:
            self._conn.execute("VACUUM")
            # A reader pins the WAL; waiting the whole busy_timeout for it helps nobody.
            self._conn.execute("PRAGMA busy_timeout=2000")
            try:
                busy = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            finally:
                self._conn.execute("PRAGMA busy_timeout=30000")
        if busy and next(iter(busy.values())):
            raise StoreError("another process kept the database busy, so the deleted data may "
                             "still be in the WAL: stop `clawproxy start` (and its judge and "
                             "trainer), then run `clawproxy sessions delete --purge`.")

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

    # -- checkpoints ---------------------------------------------------------------------------
    def published_checkpoint(self) -> dict[str, Any] | None:
        """The newest published checkpoint (version, path, kind), or None: the base model serves."""
        return self.query_one(
            "SELECT version, path, kind FROM checkpoints WHERE status='published' ORDER BY version DESC LIMIT 1"
        )

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

    # -- training --------------------------------------------------------------------------------
    def training_candidates(self, limit: int) -> list[dict[str, Any]]:
        """Judged, trainable main turns never trained nor skipped, oldest first, with score and hint."""
        return self.query(
            """
            SELECT t.id, t.prompt_token_ids, t.completion_token_ids, t.completion_logprobs,
                   t.finish_reason, t.weight_version, t.request_messages, t.request_tools, t.request_params,
                   j.score, j.hint
            FROM turns t JOIN judgments j ON j.turn_id = t.id
            WHERE t.trainable = 1 AND t.kind = 'main'
              AND t.id NOT IN (SELECT turn_id FROM trained_samples)
              AND t.id NOT IN (SELECT turn_id FROM skipped_samples)
            ORDER BY t.id LIMIT ?
            """,
            (limit,),
        )

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

    # -- training stats (`clawproxy stats`) --------------------------------------------------------
    def samples_trained_per_version(self) -> dict[int, int]:
        """Published version -> turns trained into it."""
        rows = self.query(
            "SELECT s.new_version AS v, COUNT(ts.turn_id) AS n FROM train_steps s "
            "JOIN trained_samples ts ON ts.step_id = s.id WHERE s.status='published' GROUP BY s.new_version"
        )
        return {r["v"]: r["n"] for r in rows}

    def served_turns_per_version(self) -> list[dict[str, Any]]:
        """Per weight version that served main turns: v, n (turns), judged, mean (score)."""
        return self.query(
            "SELECT t.weight_version AS v, COUNT(*) AS n, COUNT(j.turn_id) AS judged, AVG(j.score) AS mean "
            "FROM turns t LEFT JOIN judgments j ON j.turn_id = t.id WHERE t.kind='main' GROUP BY t.weight_version"
        )

    def steps_per_base_version(self) -> list[dict[str, Any]]:
        """Train steps counted by the version they started from and their status: v, status, n."""
        return self.query(
            "SELECT base_version AS v, status, COUNT(*) AS n FROM train_steps GROUP BY base_version, status"
        )

    def gate_failed_steps(self) -> list[dict[str, Any]]:
        return self.query(
            "SELECT id, base_version, created_at, metrics FROM train_steps WHERE status='gate_failed' ORDER BY id"
        )

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        """Events of one kind (ts, data), oldest first."""
        return self.query("SELECT ts, data FROM events WHERE kind=? ORDER BY id", (kind,))

    def skipped_by_reason(self) -> dict[str, int]:
        return {r["reason"]: r["n"] for r in self.query("SELECT reason, COUNT(*) AS n FROM skipped_samples GROUP BY reason")}

    # -- metrics reads (the proxy's /metrics: the judge, trainer and engine run in other processes) --
    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Reads inside see one state of the database (a read transaction: no write lock)."""
        with self._lock:
            self._conn.execute("BEGIN DEFERRED")
            try:
                yield
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")

    def vote_counts(self, after_id: int = 0) -> list[dict[str, Any]]:
        """Votes with an id above ``after_id`` counted by voter and score (None: a failed vote):
        voter, score, n, last_id (the highest id in the group). Ids only grow: counts add up."""
        return self.query(
            "SELECT voter, score, COUNT(*) AS n, MAX(id) AS last_id FROM votes WHERE id > ? GROUP BY voter, score",
            (after_id,),
        )

    def vote_count(self) -> int:
        return self.query_one("SELECT COUNT(*) AS n FROM votes")["n"]

    def judgment_counts(self) -> dict[int, int]:
        """Judged turns by majority score."""
        return {r["score"]: r["n"] for r in self.query("SELECT score, COUNT(*) AS n FROM judgments GROUP BY score")}

    def judge_backlog(self) -> dict[str, Any]:
        """pending: trainable main turns with a next state and no judgment (what the judge picks);
        since: when the oldest of them got its next state (its next turn's time), None when none."""
        return self.query_one(
            "SELECT COUNT(*) AS pending, MIN(COALESCE(nx.created_at, u.created_at)) AS since "
            f"FROM ({_UNJUDGED}) u LEFT JOIN turns nx ON nx.id = u.next_turn_id"
        )

    def step_counts(self) -> dict[str, int]:
        """Train steps by status (published, gate_failed, error, superseded)."""
        return {r["status"]: r["n"] for r in self.query("SELECT status, COUNT(*) AS n FROM train_steps GROUP BY status")}

    def trained_sample_count(self) -> int:
        return self.query_one("SELECT COUNT(*) AS n FROM trained_samples")["n"]

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

    def newest_published(self) -> dict[str, Any] | None:
        """The serving version and when it was published: version, created_at; None: the base model."""
        return self.query_one(
            "SELECT version, created_at FROM checkpoints WHERE status='published' ORDER BY version DESC LIMIT 1"
        )

    def step_count(self) -> int:
        return self.query_one("SELECT COUNT(*) AS n FROM train_steps")["n"]

    # -- sessions (`clawproxy sessions`) -----------------------------------------------------------
    def get_session(self, session_id: str) -> dict[str, Any] | None:
        return self.query_one("SELECT * FROM sessions WHERE id=?", (session_id,))

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

    # -- the simulator's accounting (`clawproxy simulate`) -------------------------------------------
    def main_turns_scored(self, session_prefix: str) -> list[dict[str, Any]]:
        """Main turns of the sessions whose id starts with ``session_prefix``, by id: id, turn_index,
        trainable, reason, next_state and the judge's score (None when not judged)."""
        return self.query(
            "SELECT t.id, t.turn_index, t.trainable, t.reason, t.next_state, j.score FROM turns t "
            "LEFT JOIN judgments j ON j.turn_id = t.id WHERE t.session_id LIKE ? AND t.kind='main' "
            "ORDER BY t.id",
            (session_prefix + "%",),
        )

    def was_trained(self, turn_id: int) -> bool:
        return self.query_one("SELECT 1 AS x FROM trained_samples WHERE turn_id=? LIMIT 1", (turn_id,)) is not None

    def trained_kind(self, turn_id: int) -> str | None:
        """The sample kind a turn was trained as (rl | rl_opd | opd; '' from before kinds were kept),
        or None when it was never trained."""
        row = self.query_one("SELECT kind FROM trained_samples WHERE turn_id=? LIMIT 1", (turn_id,))
        return None if row is None else str(row["kind"] or "")

    def trained_by_kind(self) -> dict[str, int]:
        """Trained turns counted by sample kind."""
        rows = self.query("SELECT COALESCE(kind, '') AS kind, COUNT(DISTINCT turn_id) AS n FROM trained_samples "
                          "GROUP BY COALESCE(kind, '')")
        return {r["kind"]: r["n"] for r in rows}

    def skip_reason(self, turn_id: int) -> str | None:
        """Why the trainer skipped this turn, or None."""
        row = self.query_one("SELECT reason FROM skipped_samples WHERE turn_id=?", (turn_id,))
        return None if row is None else str(row["reason"])

    def add_judgment(self, turn_id: int, score: int, hint: str | None, voter: str) -> None:
        """A judgment from outside the judge (the simulator's oracle); a turn already judged keeps its own."""
        self.insert("judgments", {"turn_id": turn_id, "score": score, "hint": hint, "voter": voter,
                                  "created_at": time.time()}, or_ignore=True)

    # -- dashboard reads ---------------------------------------------------------------------------
    # What the dashboard (clawproxy/proxy/ui) shows; it calls these on a ``Store.reader`` connection.
    def turns_and_sessions_since(self, since: float) -> dict[str, int]:
        """Turns recorded since ``since`` and the sessions they belong to."""
        return self.query_one(
            "SELECT COUNT(*) AS turns, COUNT(DISTINCT session_id) AS sessions FROM turns WHERE created_at >= ?",
            (since,),
        )

    def serving_checkpoint(self) -> dict[str, Any] | None:
        """The newest published checkpoint: version, created_at (when it was published), gate."""
        return self.query_one(
            "SELECT version, created_at, gate FROM checkpoints WHERE status='published' ORDER BY version DESC LIMIT 1"
        )

    def judge_progress(self) -> dict[str, Any]:
        """pending: turns the judge will score (trainable main turns with a next state and no
        judgment yet); judged: judgments written; last_at: when the newest was written."""
        return self.query_one(
            f"SELECT (SELECT COUNT(*) FROM ({_UNJUDGED})) AS pending, "
            "(SELECT COUNT(*) FROM judgments) AS judged, (SELECT MAX(created_at) FROM judgments) AS last_at"
        )

    def untrained_judged_count(self) -> int:
        """Judged, trainable main turns neither trained nor skipped yet (what the trainer's next
        batch is drawn from, before its own filters)."""
        return self.query_one(
            "SELECT COUNT(*) AS n FROM turns t JOIN judgments j ON j.turn_id = t.id "
            "WHERE t.trainable = 1 AND t.kind = 'main' AND t.id NOT IN (SELECT turn_id FROM trained_samples) "
            "AND t.id NOT IN (SELECT turn_id FROM skipped_samples)"
        )["n"]

    def last_event(self, kinds: Iterable[str]) -> dict[str, Any] | None:
        """The newest event of one of ``kinds``: id, ts, kind, data."""
        kinds = list(kinds)
        return self.query_one(
            f"SELECT id, ts, kind, data FROM events WHERE kind IN ({', '.join('?' * len(kinds))}) "
            "ORDER BY id DESC LIMIT 1",
            kinds,
        )

    def sessions_filtered(self, trainable: bool | None, score: str | None, limit: int) -> list[dict[str, Any]]:
        """``list_sessions`` rows, newest first, keeping sessions with (``trainable`` True) or without
        trainable turns, and whose mean judge score is ``score``: pos, neg, zero or none (unjudged)."""
        having = []
        if trainable is not None:
            having.append("COALESCE(SUM(t.trainable), 0) > 0" if trainable else "COALESCE(SUM(t.trainable), 0) = 0")
        having += {"pos": ["AVG(j.score) > 0"], "neg": ["AVG(j.score) < 0"], "zero": ["AVG(j.score) = 0"],
                   "none": ["COUNT(j.turn_id) = 0"]}.get(score or "", [])
        return self.query(
            "SELECT s.*, SUM(t.kind = 'main') AS main_turns, SUM(t.kind = 'side') AS side_turns, "
            "SUM(t.kind = 'retry') AS retry_turns, SUM(t.trainable) AS trainable_turns, "
            "AVG(j.score) AS mean_score, COUNT(j.turn_id) AS judged_turns "
            "FROM sessions s LEFT JOIN turns t ON t.session_id = s.id LEFT JOIN judgments j ON j.turn_id = t.id "
            f"GROUP BY s.id {'HAVING ' + ' AND '.join(having) if having else ''} "
            "ORDER BY s.last_seen DESC LIMIT ?",
            (limit,),
        )

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

    def training_fate(self, turn_ids: list[int]) -> dict[int, dict[str, Any]]:
        """turn id -> {step: the train step that used it or None, skipped: the trainer's reason or None}."""
        marks = ", ".join("?" * len(turn_ids))
        out: dict[int, dict[str, Any]] = {t: {"step": None, "skipped": None} for t in turn_ids}
        for r in self.query(f"SELECT turn_id, MIN(step_id) AS s FROM trained_samples WHERE turn_id IN ({marks}) "
                            "GROUP BY turn_id", turn_ids):
            out[r["turn_id"]]["step"] = r["s"]
        for r in self.query(f"SELECT turn_id, reason FROM skipped_samples WHERE turn_id IN ({marks})", turn_ids):
            out[r["turn_id"]]["skipped"] = r["reason"]
        return out

    def steps_with_samples(self) -> list[dict[str, Any]]:
        """Every train step, oldest first: id, created_at, method, status, base/new version, metrics,
        and ``samples``, the turns it trained on."""
        return self.query(
            "SELECT s.id, s.created_at, s.method, s.status, s.base_version, s.new_version, s.metrics, "
            "(SELECT COUNT(*) FROM trained_samples ts WHERE ts.step_id = s.id) AS samples "
            "FROM train_steps s ORDER BY s.id"
        )

    def last_step(self) -> dict[str, Any] | None:
        """The newest train step: id, created_at, status, base_version, new_version, metrics."""
        return self.query_one("SELECT id, created_at, status, base_version, new_version, metrics FROM train_steps "
                              "ORDER BY id DESC LIMIT 1")

    def mean_score_over_time(self, bucket_s: float) -> list[dict[str, Any]]:
        """Mean judge score of main turns per ``bucket_s`` of their recording time: t (bucket start), mean, n."""
        return self.query(
            "SELECT CAST(t.created_at / ? AS INTEGER) * ? AS t, AVG(j.score) AS mean, COUNT(*) AS n "
            "FROM turns t JOIN judgments j ON j.turn_id = t.id WHERE t.kind='main' GROUP BY 1 ORDER BY 1",
            (bucket_s, bucket_s),
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
        return self.query_one(
            "SELECT COALESCE((SELECT MAX(id) FROM turns), 0) AS turn, COALESCE((SELECT MAX(id) FROM train_steps), 0) AS step, "
            "(SELECT COUNT(*) FROM judgments) AS judged, COALESCE((SELECT MAX(id) FROM events), 0) AS event"
        )


# The judge's queue: trainable main turns with a next state and no judgment yet, oldest first.
_UNJUDGED = """
    SELECT t.* FROM turns t
    LEFT JOIN judgments j ON j.turn_id = t.id
    WHERE t.kind = 'main' AND t.trainable = 1 AND t.next_state IS NOT NULL AND j.turn_id IS NULL
    ORDER BY t.id
"""


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
