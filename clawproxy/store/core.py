"""The store's core: one SQLite connection (WAL) under the data dir, migrations, transactions and
the generic row helpers the concern modules build on.

Created with owner-only permissions (dir 0700, files 0600) and never wiped on start. JSON columns
hold orjson-encoded text. A store is thread-safe (one connection guarded by a lock); async code
calls it from a worker thread (the proxy's recorder owns one), never from the event loop.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import orjson

from clawproxy.errors import StoreError
from clawproxy.store.migrations import MIGRATIONS

Params = Sequence[Any] | Mapping[str, Any]  # what sqlite3 binds to ? or :name placeholders


def inserted_id(cur: sqlite3.Cursor) -> int:
    """The rowid an INSERT just wrote (sqlite3 types ``lastrowid`` as optional; after an INSERT it is set)."""
    if cur.lastrowid is None:
        raise StoreError("the INSERT reported no rowid")
    return cur.lastrowid


JSON_COLUMNS = {
    "request_messages", "request_tools", "request_params", "response_tool_calls", "usage",
    "prompt_token_ids", "completion_token_ids", "completion_logprobs", "weight_versions",
    "next_state", "metrics", "gate", "data", "applied_ids",
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


class Core:
    """The connection. Open with ``Store(path)``; it creates and migrates the database.

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
    def reader(cls, path: str | Path) -> Self:
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
        return self.query_row("PRAGMA user_version")["user_version"]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextmanager
    def publish_lock(self) -> Iterator[None]:
        """Serializes whoever changes what is served or whose it is (a trainer publishing,
        `clawproxy rollback`, `clawproxy users remove`): an exclusive ``flock`` on a file beside the
        database, held from reading the current version until the change is recorded. Without it a
        step trained from v5 could publish over a rollback, or for a user removed while it trained."""
        import fcntl

        with open(self.path.with_name(self.path.name + ".publish.lock"), "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

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

    def execute(self, sql: str, params: Params = ()) -> sqlite3.Cursor:
        with self._lock:
            return self._conn.execute(sql, params)

    def query(self, sql: str, params: Params = ()) -> list[dict[str, Any]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def query_one(self, sql: str, params: Params = ()) -> dict[str, Any] | None:
        with self._lock:
            return self._conn.execute(sql, params).fetchone()

    def query_row(self, sql: str, params: Params = ()) -> dict[str, Any]:
        """The row a query always yields (an aggregate, a PRAGMA); ``StoreError`` if it yields none."""
        row = self.query_one(sql, params)
        if row is None:
            raise StoreError(f"no row from {sql!r}")
        return row

    # -- generic row helpers -----------------------------------------------------------------
    def insert(self, table: str, values: dict[str, Any], *, or_ignore: bool = False) -> int:
        cols = list(values)
        vals = [dumps(values[c]) if c in JSON_COLUMNS else values[c] for c in cols]
        verb = "INSERT OR IGNORE" if or_ignore else "INSERT"
        sql = f"{verb} INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        with self._lock:
            return inserted_id(self._conn.execute(sql, vals))

    def update(self, table: str, key: str, key_value: Any, values: dict[str, Any]) -> None:
        if not values:
            return
        cols = list(values)
        vals = [dumps(values[c]) if c in JSON_COLUMNS else values[c] for c in cols]
        sql = f"UPDATE {table} SET {', '.join(f'{c}=?' for c in cols)} WHERE {key}=?"
        with self._lock:
            self._conn.execute(sql, [*vals, key_value])

    def log_event(self, event_type: str, data: dict[str, Any] | None = None) -> None:
        self.insert("events", {"ts": time.time(), "kind": event_type, "data": data})  # the kind column

    def tables(self) -> list[str]:
        """The tables of this database, read from its schema (SQLite's own excluded)."""
        rows = self.query("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
        return [r["name"] for r in rows]

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


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
