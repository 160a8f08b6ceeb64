"""What the journal redacts on the request path: the request body message by message with a cache
(redact_body: every secret the whole-body redaction finds, paying for new messages only), and the
turn the tap built rather than the raw stream."""

from __future__ import annotations

import random
import time

import orjson

from clawproxy.proxy.journal import journal_entry, read_journal
from clawproxy.proxy.redact import Redactor, _redacted_json, redact_body
from clawproxy.proxy.sse import Added, StreamTap
from clawproxy.proxy.tap import Capture
from tests.rig.secret_shapes import CLEAN, shapes


def _whole(r: Redactor, body: dict) -> tuple[dict, bool]:
    """The redaction of the body in one piece, as the journal did it before."""
    tree, changed = r.tree(body)
    data = orjson.dumps(tree)
    clean = r.bytes(data)
    return orjson.loads(clean), changed or clean != data


def test_every_secret_shape_is_redacted_as_by_the_whole_body():
    r = Redactor()
    for label, secret, body in shapes(random.Random(7)):
        out, changed = redact_body(r, body, orjson.dumps(body))
        assert secret.encode() not in out, label
        assert (orjson.loads(out), changed) == _whole(r, body), label


def test_a_clean_body_is_unchanged_and_says_so():
    out, changed = redact_body(Redactor(), CLEAN, orjson.dumps(CLEAN))
    assert not changed and orjson.loads(out) == CLEAN


def test_what_the_parse_dropped_never_reaches_the_output():
    raw = b'{"messages": [{"role": "user", "content": "sk-' + b"a1B2" * 8 + b'"}], "messages": []}'
    body = orjson.loads(raw)
    out, _ = redact_body(Redactor(), body, raw)
    assert b"sk-" not in out and orjson.loads(out) == {"messages": []}


def test_a_resent_conversation_costs_its_new_message_only():
    r = Redactor()
    system = {"role": "system", "content": "You are OpenClaw. " * 500}
    redact_body(r, {"model": "m", "messages": [system, {"role": "user", "content": "one"}]}, None)
    before = _redacted_json.cache_info()
    redact_body(r, {"model": "m", "messages": [system, {"role": "user", "content": "two"}]}, None)
    after = _redacted_json.cache_info()
    assert (after.hits - before.hits, after.misses - before.misses) == (2, 1)  # model, system; "two"


def test_a_body_too_deep_to_serialize_is_redacted_whole():
    deep: list = []
    for _ in range(300):  # deeper than orjson writes (255)
        deep = [deep]
    body = {"messages": [{"role": "user", "content": "x"}], "extra": deep}
    raw = b'{"messages":[{"role":"user","content":"x"}],"extra":' + b"[" * 301 + b"]" * 301 + b"}"
    out, changed = redact_body(Redactor(), body, raw)
    assert out == raw and not changed


def test_a_secret_streamed_across_events_never_reaches_the_journal(tmp_path):
    secret = "sk-" + "a1B2c3D4" * 4
    pieces = ["my key is ", secret[:9], secret[9:], " ok"]
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "key?"}]}
    cap = Capture("r1", time.time(), "/v1/chat/completions", time.perf_counter(), body=body,
                  raw_body=orjson.dumps(body), stream=True, http_status=200)
    tap = StreamTap(Added(logprobs=True, token_ids=True))
    for i, p in enumerate(pieces):
        tap.feed(b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": p},
                                                         "token_ids": [i]}]}) + b"\n\n")
    tap.feed(b"data: [DONE]\n\n")
    cap.chunks, cap.assembled, cap.done = tap.chunks, tap.turn(), tap.done
    cap.finish("ok")
    entry = journal_entry(cap, Redactor())
    assert secret[9:].encode() not in entry and secret[:9].encode() not in entry
    assert secret[9:].encode() in b"".join(cap.chunks)  # the raw events held it, in pieces
    (tmp_path / "journal.bin").write_bytes(entry)
    (back,) = read_journal(tmp_path / "journal.bin")
    assert back.assembled is not None and back.assembled.text == "my key is [REDACTED] ok"
    assert back.redacted  # its token ids go at replay
