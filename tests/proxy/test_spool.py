"""The spool alone: records kept in order while the store fails, replayed oldest first, a store
that still fails leaves the files as they are, a record the store refuses goes to reject."""

from __future__ import annotations

import sqlite3

import orjson
import pytest

from clawproxy.proxy.spool import Spool, is_store_failure


def _spool(tmp_path, n: int) -> Spool:
    s = Spool(tmp_path)
    for i in range(n):
        s.append(orjson.dumps({"request_id": f"r{i}"}))
    return s


class Store:
    """Takes records until ``fail_at`` (a request id), then raises ``error`` for that one."""

    def __init__(self, fail_at: str | None = None, error: Exception | None = None):
        self.got: list[str] = []
        self.fail_at, self.error = fail_at, error

    def ingest(self, rec: dict) -> None:
        if rec["request_id"] == self.fail_at:
            assert self.error is not None
            raise self.error
        self.got.append(rec["request_id"])


def _reject(into: list):
    return lambda rec, reason, text: into.append((rec["request_id"] if rec else None, reason))


def test_what_fails_the_store_and_what_fails_one_record():
    assert is_store_failure(sqlite3.OperationalError("disk I/O error"))
    assert is_store_failure(OSError(28, "No space left on device"))
    assert not is_store_failure(sqlite3.IntegrityError("NOT NULL constraint failed"))
    assert not is_store_failure(TypeError("bad type"))


def test_records_replay_oldest_first_and_the_spool_empties(tmp_path):
    s = _spool(tmp_path, 3)
    assert (s.records, s.count()) == (3, 3)
    store, rejected = Store(), []
    r = s.replay(store.ingest, _reject(rejected))
    # The first record is written once as a probe, then again with the rest (ingest is idempotent).
    assert store.got == ["r0", "r0", "r1", "r2"] and r.empty and r.replayed == 3
    assert (s.records, s.files(), rejected) == (0, [], [])


def test_a_store_that_still_fails_leaves_the_files_untouched(tmp_path):
    s = _spool(tmp_path, 2)
    before = s.path.read_bytes()
    r = s.replay(Store("r0", sqlite3.OperationalError("locked")).ingest, _reject([]))
    assert not r.empty and isinstance(r.failure, sqlite3.OperationalError)
    assert s.files() == [s.path] and s.path.read_bytes() == before


def test_a_failure_midway_keeps_the_rest_in_order(tmp_path):
    s = _spool(tmp_path, 4)
    store = Store("r2", OSError(28, "No space left on device"))
    r = s.replay(store.ingest, _reject([]))
    assert store.got == ["r0", "r0", "r1"] and not r.empty and r.replayed == 2
    assert [orjson.loads(x)["request_id"] for x in s.path.read_bytes().splitlines()] == ["r2", "r3"]
    assert s.count() == 2


def test_a_record_the_store_refuses_and_a_corrupt_line_go_to_reject(tmp_path):
    s = _spool(tmp_path, 3)
    with open(s.path, "ab") as f:
        f.write(b"{torn\n")
    store, rejected = Store("r1", sqlite3.IntegrityError("NOT NULL")), []
    r = s.replay(store.ingest, _reject(rejected))
    assert r.empty and store.got == ["r0", "r0", "r2"]
    assert rejected == [("r1", "cannot store: IntegrityError: NOT NULL"), (None, "corrupt spool line")]


def test_a_spool_it_cannot_write_raises_for_the_recorder_to_count(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        Spool(blocker).append(b"{}")
