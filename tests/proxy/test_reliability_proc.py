"""Issue 15 against real processes: SIGKILL right after [DONE], and a hypothesis fuzz of bodies,
headers, paths and upstream streams. The bench (bench/reliability.py) runs the same at scale."""

from __future__ import annotations

import os
import random
import signal
import time

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.rig.proc_rig import (
    FakeProc,
    ProxyProc,
    chat_body,
    http_request,
    raw_header,
    raw_request,
    store_counts,
    store_texts,
    stream_until_done,
)


@pytest.fixture(scope="module")
def fake():
    f = FakeProc()
    yield f
    f.close()


def test_sigkill_right_after_done_loses_no_finished_turn(fake, tmp_path):
    proxy = ProxyProc(fake.url, tmp_path / "data")
    words = []
    try:
        for i in range(6):
            proxy.start()
            word = f"kill{i}x{random.randrange(10**6)}"
            stream_until_done(proxy.port, chat_body(word), [(b"x-fake-chunks", b"8")])
            time.sleep(random.choice([0, 0, 0.005, 0.02]))  # a random moment after [DONE], not a synchronisation
            proxy.kill(signal.SIGKILL)
            words.append(word)
        proxy.start()  # replays the journal
        proxy.wait_idle()
    finally:
        proxy.stop()
    texts = store_texts(tmp_path / "data" / "clawproxy.db")
    assert [w for w in words if not any(w in t for t in texts)] == []
    assert len(texts) == len(words)  # nothing twice


# -- fuzz --------------------------------------------------------------------------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=20,
)
_message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool", "system"]) | _json},
                                 optional={"content": _json | st.text(), "tool_calls": _json,
                                           "name": _json})
_body = st.fixed_dictionaries(
    {"messages": st.lists(_message | _json, max_size=4)},
    optional={"model": _json, "stream": st.booleans() | _json, "tools": _json,
              "temperature": _json, "api_key": st.text(), "prompt_cache_key": _json,
              "logprobs": _json, "return_token_ids": _json, "stream_options": _json},
)
_header_value = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"").replace(b"\0", b""))
_sse = st.lists(
    st.sampled_from([b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n',
                     b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
                     b"data: [DONE]\n\n", b"data: {\n\n", b"event: x\n", b"\r\n", b": hi\n\n",
                     b'data: {"error":{"message":"boom"}}\n\n', b"data: [1,2]\n\n"])
    | st.binary(max_size=30), max_size=8).map(b"".join)


@pytest.fixture(scope="module")
def fuzz_proxy(fake, tmp_path_factory):
    data = tmp_path_factory.mktemp("fuzz") / "data"
    p = ProxyProc(fake.url, data, "--set", "proxy.body_timeout_s=2", "--set", "proxy.extra_routes=[]")
    p.start()
    yield p
    s = p.wait_idle()
    p.stop()
    turns, quarantined = store_counts(data / "clawproxy.db")
    log = p.log.read_text(errors="replace")
    # Every chat request the proxy took is in the store or quarantined (with its reason).
    assert (turns + quarantined, s["spool_records"], s["turns_lost"]) == (s["chat_requests"], 0, 0), s
    assert "Traceback" not in log and "proxy error" not in log, log[-3000:]


FUZZ = settings(max_examples=int(os.environ.get("CLAWPROXY_FUZZ_EXAMPLES", "60")), deadline=None,
                suppress_health_check=list(HealthCheck))


def is_plain_error(status: int | None, out: bytes) -> bool:
    """An error answer (4xx/5xx) that is not JSON: what an OpenAI client cannot parse."""
    if status is None or status < 400:
        return False
    head = out.split(b"\r\n\r\n", 1)[0].lower()
    return b"\r\ncontent-type: application/json" not in head


def _check(status: int | None, out: bytes) -> None:
    assert status is not None, out[:300]  # an answer, always
    # Upstream bytes pass through as they are: only the proxy's own error object counts.
    assert status != 500 and b'"message":"internal proxy error' not in out, out[:500]
    assert not is_plain_error(status, out), out[:500]  # the fake upstream answers JSON too


@FUZZ
@given(body=_body, stream=st.booleans())
def test_fuzz_bodies(fuzz_proxy, body, stream):
    body["stream"] = stream
    try:
        data = orjson.dumps(body)
    except orjson.JSONEncodeError:
        return
    status, out = raw_request(fuzz_proxy.port, http_request(
        "POST", b"/v1/chat/completions", data, [(b"Content-Type", b"application/json")]), 15)
    _check(status, out)


@FUZZ
@given(raw=st.binary(max_size=200), ctype=st.sampled_from([b"application/json", b"text/plain"]),
       enc=st.sampled_from([None, b"gzip", b"deflate", b"br"]))
def test_fuzz_raw_bodies(fuzz_proxy, raw, ctype, enc):
    h = [(b"Content-Type", ctype)] + ([(b"Content-Encoding", enc)] if enc else [])
    status, out = raw_request(fuzz_proxy.port, http_request("POST", b"/v1/chat/completions", raw, h), 15)
    _check(status, out)


@FUZZ
# x-fake-* steer the fake upstream (hang, delays): they are no client's headers.
@given(sid=_header_value, auth=_header_value,
       name=st.from_regex(rb"\Ax-[a-z0-9-]{1,12}\Z").filter(lambda n: not n.startswith(b"x-fake")),
       value=_header_value)
def test_fuzz_headers(fuzz_proxy, sid, auth, name, value):
    body = chat_body("headers")
    status, out = raw_request(fuzz_proxy.port, http_request(
        "POST", b"/v1/chat/completions", body,
        [(b"Content-Type", b"application/json"), (b"session_id", sid), (b"Authorization", auth),
         (name, value)]), 15)
    _check(status, out)  # what the HTTP parser refuses (not a valid header) is answered in JSON too


@FUZZ
@given(path=st.binary(min_size=1, max_size=60).map(lambda b: b"/" + b.replace(b" ", b"").replace(b"\r", b"").replace(b"\n", b"")),
       method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS"]))
def test_fuzz_paths(fuzz_proxy, path, method):
    status, out = raw_request(fuzz_proxy.port, http_request(method, path, b"{}", [(b"Content-Type", b"application/json")]), 15)
    _check(status, out)


@FUZZ
@given(sse=_sse, close=st.booleans())
def test_fuzz_upstream_streams(fuzz_proxy, sse, close):
    status, out = raw_request(fuzz_proxy.port, http_request(
        "POST", b"/v1/chat/completions", chat_body("upstream"),
        [(b"Content-Type", b"application/json"), raw_header(sse),
         (b"x-fake-raw-close", b"1" if close else b"0")]), 15)
    _check(status, out)
    if status == 200 and b"data: [DONE]" not in sse:
        assert b"before [DONE]" in out  # the client is told, in band
