"""The quarantine alone, with a real store: a record kept with its reason in the table, in the
file while the store is down (moved in later), and counted as lost when neither takes it."""

from __future__ import annotations

import orjson

from clawproxy.proxy.quarantine import Quarantine
from clawproxy.store import Store


def _rows(store: Store) -> list[tuple]:
    return [(r["request_id"], r["reason"]) for r in store.query("SELECT * FROM quarantine ORDER BY id")]


def test_kept_in_the_table_with_its_reason(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    try:
        q = Quarantine(tmp_path)
        assert q.keep(store, "r1", "cannot store: TypeError", {"request_id": "r1", "x": 1})
        assert _rows(store) == [("r1", "cannot store: TypeError")] and q.count == 1
        assert not q.path.exists()
    finally:
        store.close()


def test_kept_in_the_file_while_the_store_is_down_then_moved_in(tmp_path):
    q = Quarantine(tmp_path)
    assert q.keep(None, "r1", "cannot parse", None, "request: {...}")
    assert q.keep(None, None, "corrupt spool line", None, "{torn")
    assert [orjson.loads(x)["reason"] for x in q.path.read_bytes().splitlines()] == [
        "cannot parse", "corrupt spool line"]
    store = Store(tmp_path / "db.sqlite")
    try:
        assert q.recount(store) == 2
        q.move_into(store)
        assert _rows(store) == [("r1", "cannot parse"), (None, "corrupt spool line")]
        assert not q.path.exists() and q.recount(store) == 2
    finally:
        store.close()


def test_a_store_that_refuses_falls_back_to_the_file(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    store.close()  # a closed store raises on every call
    q = Quarantine(tmp_path)
    assert q.keep(store, "r1", "cannot store", {"request_id": "r1"})
    assert orjson.loads(q.path.read_bytes())["record"] == '{"request_id":"r1"}'


def test_neither_store_nor_file_is_a_loss_with_its_reason(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    q = Quarantine(blocker)  # a file where the data folder should be
    assert not q.keep(None, "r1", "cannot parse", None, "x")
    assert q.count == 0 and q.last_loss is not None and "quarantine.jsonl" in q.last_loss
