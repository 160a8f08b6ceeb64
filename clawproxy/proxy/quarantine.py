"""The quarantine: one record the store refuses for its own sake, kept aside with the reason.

A field of a type no column takes, nesting too deep for the serializer, a bug of ours: the record
goes alone to the store's ``quarantine`` table, or to ``<data_dir>/quarantine.jsonl`` (fsynced)
while the store is down, never blocking the others. The file moves into the table at the next
start with a working store. ``keep`` returns False when neither could take it: the turn is lost.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import orjson

from clawproxy.proxy.spool import count_lines, durable_append
from clawproxy.store import Store

log = logging.getLogger("clawproxy.recorder")


class Quarantine:
    """``count``: how many records are kept aside, in the table and the file together."""

    def __init__(self, data_dir: Path):
        self.path = data_dir / "quarantine.jsonl"
        self.count = 0
        self.last_loss: str | None = None  # why the last record could not be kept

    def keep(self, store: Store | None, request_id: str | None, reason: str,
             rec: dict[str, Any] | None, text: str | None = None) -> bool:
        """Keep one record (or, without one, ``text``) with its reason: the table, else the file."""
        if text is None:
            try:
                text = orjson.dumps(rec).decode()
            except Exception:
                text = repr(rec)[:100_000]
        log.warning("turn %s quarantined: %s", request_id, reason)
        if store is not None:
            try:
                store.quarantine(request_id, reason, text)
                self.count += 1
                return True
            except Exception as e:
                log.error("cannot quarantine turn %s in the store (%s); using %s", request_id, e,
                          self.path)
        line = orjson.dumps({"request_id": request_id, "created_at": time.time(),
                             "reason": reason, "record": text})
        try:
            durable_append(self.path, line)
        except OSError as e:
            self.last_loss = f"cannot write {self.path.name}: {e}"
            log.error("RECORD LOST: cannot write %s (%s)", self.path, e)
            return False
        self.count += 1
        return True

    def recount(self, store: Store | None) -> int:
        n = 0
        if store is not None:
            try:
                n = store.quarantine_count()
            except Exception as e:
                log.error("cannot count quarantined turns (%s)", e)
        self.count = n + count_lines([self.path])
        return self.count

    def move_into(self, store: Store) -> None:
        """Records quarantined while the store was down go into its table, all or none."""
        if not self.path.exists():
            return
        try:
            rows = []
            for line in self.path.read_bytes().splitlines():
                try:
                    q = orjson.loads(line)
                except orjson.JSONDecodeError:  # a blank or torn line
                    continue
                rows.append((q.get("request_id"), q.get("reason") or "?", q.get("record")))
            store.quarantine_many(rows)  # the file goes only once they are in
            self.path.unlink()
        except Exception as e:
            log.error("cannot move %s into the store (%s); kept", self.path, e)
