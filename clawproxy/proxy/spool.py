"""The spool: ``<data_dir>/spool*.jsonl``, records the store could not take, replayed oldest first.

While the store fails (full disk, I/O error, locked, cannot open), each record is appended to
``spool.jsonl`` and fsynced. Replay renames a file to ``spool-replay-*.jsonl`` before reading it,
so a crash mid-replay leaves it to the next start; ingest is idempotent by request_id. While the
store still fails, the first record fails alone and the files are left as they are, so retrying
costs one write per call. A record the store refuses for its own sake goes to ``reject`` (the
quarantine), never retried forever.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from clawproxy.errors import StoreError

log = logging.getLogger("clawproxy.recorder")
# SQLite errors that say the record itself is wrong; every other sqlite3.Error is the store.
RECORD_SQL_ERRORS = (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.ProgrammingError,
                     sqlite3.DataError)


def is_store_failure(e: BaseException) -> bool:
    """A failure of the store (retry later: spool) rather than of this one record (quarantine)."""
    if isinstance(e, sqlite3.Error):
        return not isinstance(e, RECORD_SQL_ERRORS)
    return isinstance(e, (StoreError, OSError))


def durable_append(path: Path, line: bytes) -> None:
    """Append one line and fsync it (raises OSError)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def count_lines(paths: list[Path]) -> int:
    n = 0
    for p in paths:
        try:
            with open(p, "rb") as f:
                n += sum(1 for line in f if line.strip())
        except OSError:
            pass
    return n


@dataclass
class Replay:
    """What one replay did: ``empty`` when no record is left in the spool."""

    empty: bool
    replayed: int = 0
    failure: BaseException | None = None  # the store failure that stopped it


# ingest(record) writes one record to the store; reject(record or None, reason, text) quarantines.
Ingest = Callable[[dict[str, Any]], None]
Reject = Callable[[dict[str, Any] | None, str, str | None], None]


class Spool:
    """The spool files under ``data_dir``; ``records``: how many wait in them."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.path = data_dir / "spool.jsonl"
        self.records = 0

    def append(self, line: bytes) -> None:
        """Spool one serialized record (raises OSError: the turn is then lost)."""
        durable_append(self.path, line)
        self.records += 1

    def count(self) -> int:
        self.records = count_lines(self.files())
        return self.records

    def files(self) -> list[Path]:
        if not self.data_dir.exists():
            return []
        return sorted(self.data_dir.glob("spool*.jsonl"))

    def replay(self, ingest: Ingest, reject: Reject) -> Replay:
        """Feed spooled records to ``ingest``, oldest first, until the store fails."""
        files = self.files()
        if not files:
            self.records = 0
            return Replay(empty=True)
        failure = self._probe(files[0], ingest)
        if failure is not None:
            return Replay(empty=False, failure=failure)
        replayed = failed = 0
        for p in files:
            work = p if p.name.startswith("spool-replay-") else p.with_name(
                f"spool-replay-{int(time.time() * 1000)}-{os.getpid()}.jsonl")
            if work is not p:
                os.replace(p, work)
            with open(work, "rb") as f:
                lines = [line for line in f if line.strip()]
            for line in lines:
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    reject(None, "corrupt spool line", line.decode("utf-8", "replace"))
                    continue
                if failure is None:
                    try:
                        ingest(rec)
                        replayed += 1
                        continue
                    except Exception as e:
                        if not is_store_failure(e):
                            reject(rec, f"cannot store: {type(e).__name__}: {e}", None)
                            continue
                        log.error("spool replay failed (%s); keeping the rest", e)
                        failure = e
                failed += 1
                self._keep(line)
            work.unlink()
        self.records = failed
        if replayed:
            log.info("replayed %d spooled turn(s) into the store", replayed)
        return Replay(empty=failed == 0, replayed=replayed, failure=failure)

    def _probe(self, path: Path, ingest: Ingest) -> BaseException | None:
        """Write the oldest spooled record: the store failure if it still fails (files untouched)."""
        with open(path, "rb") as f:
            line = next((x for x in f if x.strip()), None)
        try:
            rec = orjson.loads(line) if line is not None else None
        except orjson.JSONDecodeError:
            return None  # the full replay quarantines it
        if rec is None:
            return None
        try:
            ingest(rec)
        except Exception as e:
            return e if is_store_failure(e) else None  # a bad record: the full replay rejects it
        return None

    def _keep(self, line: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line if line.endswith(b"\n") else line + b"\n")
        finally:
            os.close(fd)
