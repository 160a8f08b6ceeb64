"""The store across processes: the proxy, judge and trainer open the same database."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from clawproxy.store import MIGRATIONS, Store

ROOT = Path(__file__).resolve().parents[2]


def test_processes_opening_a_fresh_store_at_once_all_succeed(tmp_path):
    # Each child sleeps until the same instant, then opens (and so migrates) the same new file.
    for trial in range(3):
        db = tmp_path / f"t{trial}" / "clawproxy.db"
        at = time.time() + 1.0
        code = (f"import time; time.sleep(max(0, {at} - time.time())); "
                f"from clawproxy.store import Store; Store({str(db)!r}).close()")
        procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE,
                                  text=True) for _ in range(4)]
        errors = [p.communicate(timeout=60)[1] for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, "\n".join(errors)
        s = Store(db)
        try:
            assert s.schema_version == len(MIGRATIONS)
        finally:
            s.close()


def test_reader_sees_writes_and_cannot_write(tmp_path):
    import sqlite3

    import pytest

    from clawproxy.errors import StoreError

    with pytest.raises(StoreError, match="read-only"):
        Store.reader(tmp_path / "missing.db")
    writer = Store(tmp_path / "s.db")
    reader = Store.reader(tmp_path / "s.db")
    writer.log_event("hello", {"n": 1})
    assert [e["data"] for e in reader.events_of("hello")] == [{"n": 1}]
    with pytest.raises(sqlite3.OperationalError, match="readonly|read-only"):
        reader.log_event("nope")
    writer.close()
    reader.close()


def test_reader_snapshot_sees_one_state_while_a_writer_commits(tmp_path):
    writer = Store(tmp_path / "s.db")
    reader = Store.reader(tmp_path / "s.db")
    writer.log_event("publish")
    with reader.snapshot():
        assert len(reader.events_of("publish")) == 1
        writer.log_event("publish")  # the writer is not blocked by the reader
        assert len(reader.events_of("publish")) == 1
    assert len(reader.events_of("publish")) == 2
    writer.close()
    reader.close()
