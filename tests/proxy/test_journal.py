"""The crash journal alone: entries appended and read back, a torn tail skipped, a failing disk
never raised into the request, and an older proxy's entry settled when read."""

from __future__ import annotations

import os
import time

import orjson

from clawproxy.proxy.journal import JOURNAL_MAGIC, Journal, read_journal
from clawproxy.proxy.redact import Redactor
from clawproxy.proxy.sse import Assembled
from clawproxy.proxy.tap import Capture


def _cap(rid: str, text: str = "hello", **kw) -> Capture:
    body = {"model": "m", "messages": [{"role": "user", "content": rid}]}
    cap = Capture(rid, time.time(), "/v1/chat/completions", time.perf_counter(), body=body,
                  raw_body=orjson.dumps(body), stream=True, done=True, http_status=200,
                  session_headers={"x-session-id": "s"}, **kw)
    cap.assembled = Assembled(text=text, completion_token_ids=[1, 2], events=3)
    cap.finish("ok")
    return cap


def test_appended_turns_read_back_and_truncate_empties(tmp_path):
    j = Journal(tmp_path / "journal.bin", None)
    j.open()
    for rid in ("a", "b"):
        j.append(_cap(rid))
    back = j.read()
    assert [(c.request_id, c.status, c.body, c.assembled.text if c.assembled else None) for c in back] == [
        ("a", "ok", {"model": "m", "messages": [{"role": "user", "content": "a"}]}, "hello"),
        ("b", "ok", {"model": "m", "messages": [{"role": "user", "content": "b"}]}, "hello")]
    assert back[0].assembled is not None and back[0].assembled.completion_token_ids == [1, 2]
    assert j.ok
    j.truncate()
    assert j.read() == []
    j.close()


def test_a_torn_last_entry_is_skipped(tmp_path):
    j = Journal(tmp_path / "journal.bin", None)
    j.open()
    j.append(_cap("whole"))
    j.append(_cap("torn"))
    j.close()
    data = (tmp_path / "journal.bin").read_bytes()
    (tmp_path / "journal.bin").write_bytes(data[:-3])
    assert [c.request_id for c in read_journal(tmp_path / "journal.bin")] == ["whole"]


def test_with_a_redactor_no_secret_reaches_the_disk_and_the_entry_says_so(tmp_path):
    secret = "sk-" + "Ab12Cd34" * 4
    j = Journal(tmp_path / "journal.bin", Redactor())
    j.open()
    j.append(_cap("r", text=f"your key is {secret}", error=None))
    j.close()
    assert secret.encode() not in (tmp_path / "journal.bin").read_bytes()
    (back,) = read_journal(tmp_path / "journal.bin")
    assert back.redacted and back.assembled is not None and "[REDACTED]" in back.assembled.text


def test_a_journal_it_cannot_open_or_write_is_reported_not_raised(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    j = Journal(blocker / "journal.bin", None)  # a file where its folder should be
    j.open()
    j.append(_cap("a"))  # nothing raised
    assert not j.ok
    j2 = Journal(tmp_path / "journal.bin", None)
    j2.open()
    os.close(j2._fd)  # the descriptor goes bad under it
    j2.append(_cap("b"))
    assert not j2.ok
    j2._fd = None


def test_an_older_proxys_entry_is_settled_when_read(tmp_path):
    """Entries from before the tap decided outcomes carry "ok" for an error status."""
    meta = {"id": "old", "at": time.time(), "path": "/v1/chat/completions", "stream": False,
            "done": False, "http": 500, "status": "ok", "error": None, "h": {}, "wv": None,
            "ttft": None, "total": 0.1}
    body, resp = b'{"messages": []}', b'{"error": {"message": "boom"}}'
    meta.update(nb=len(body), nr=len(resp))
    (tmp_path / "journal.bin").write_bytes(JOURNAL_MAGIC + orjson.dumps(meta) + b"\n" + body + resp)
    (back,) = read_journal(tmp_path / "journal.bin")
    assert (back.status, back.error) == ("error", resp.decode())
