"""Issue 15's reproducers: nothing a client sends or a fault does may stop recording, leak a
secret or lose a turn. Each test failed before its fix."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import logging
import socket
import time
import zlib

import orjson
import pytest

from clawproxy.errors import ConfigError
from clawproxy.proxy.app import STATS_KEY
from clawproxy.store import Store
from tests.proxy.test_durability import disk_full
from tests.proxy.test_proxy_forwarding import _body
from tests.rig.proc_rig import http_request, raw_request
from tests.waits import until, until_sync


def _port(rig) -> int:
    return int(rig.url.rsplit(":", 1)[1])


def quarantine(rig) -> list[dict]:
    s = Store(rig.cfg.db_path)
    try:
        return s.query("SELECT * FROM quarantine ORDER BY id")
    finally:
        s.close()


async def wait_idle(rig, n_turns: int, n_quarantined: int = 0, timeout: float = 10.0) -> dict:
    def idle(s: dict) -> bool:  # both counts move once the turn is committed: nothing left to settle
        return s["turns_recorded"] >= n_turns and s["quarantined"] >= n_quarantined and s["queue_depth"] == 0

    return await rig.stats_when(idle, f"{n_turns} turns recorded, {n_quarantined} quarantined", timeout)


# -- 1, 5, 6, 9: one bad record never stops recording ---------------------------------------------
async def test_odd_field_types_are_stored_and_never_an_outage(rig):
    bad = [{"model": ["x"]}, {"model": {"a": 1}}, {"tools": "nope", "temperature": [1]}]
    for i, extra in enumerate(bad):
        status, _, _ = await rig.chat({**_body(f"odd {i}"), **extra}, {"x-session-id": "odd"})
        assert status == 200
    status, _, _ = await rig.chat(_body("upstream says 400"), {"x-fake-status": "400"})
    assert status == 400
    await rig.chat(_body("normal"), {"x-session-id": "odd"})
    s = await wait_idle(rig, 5)
    assert s["store_ok"] and s["spool_records"] == 0 and s["turns_lost"] == 0, s
    turns = rig.turns()
    assert [t["model"] for t in turns[:2]] == ['["x"]', '{"a":1}']
    assert turns[-1]["response_text"].startswith("pong: normal") and turns[-1]["status"] == "ok"


async def test_upstream_dict_finish_reason_is_stored(rig):
    sse = (b'data: {"id":"x","model":"m","choices":[{"index":0,"delta":{"content":"hi"},'
           b'"finish_reason":{"weird":1}}]}\n\ndata: [DONE]\n\n')
    await rig.chat(_body("dict finish"), {"x-fake-raw": base64.b64encode(sse).decode()})
    await rig.chat(_body("after"))
    await wait_idle(rig, 2)
    t = rig.turns()
    assert t[0]["finish_reason"] == '{"weird":1}' and t[0]["reason"] == "error"
    assert t[1]["response_text"].startswith("pong: after")


async def test_too_deep_body_is_quarantined_with_its_reason(rig):
    deep: object = "x"
    for _ in range(400):  # orjson reads 1024 levels but writes only 255
        deep = [deep]
    status, _, _ = await rig.chat({**_body("deep"), "metadata": deep})
    assert status == 200
    await rig.chat(_body("after deep"))
    s = await wait_idle(rig, 1, 1)
    assert s["quarantined"] == 1 and s["store_ok"] and s["spool_records"] == 0, s
    [q] = quarantine(rig)
    assert "Recursion" in q["reason"] or "recursion" in q["reason"], q["reason"]
    assert "after deep" not in q["record"] and '"deep"' in q["record"]
    assert [t["response_text"].split(" part")[0] for t in rig.turns()] == ["pong: after deep"]
    async with rig.client.get(rig.url + "/clawproxy/health") as r:
        assert (await r.json())["quarantined"] == 1


async def test_non_utf8_session_header_keeps_the_turn_and_its_batch(rig):
    # aiohttp hands bytes that are not UTF-8 over as surrogate escapes; the proxy's header writer
    # sends those back as the original bytes, so this client really sends "s-\xff".
    results = await asyncio.gather(*[
        rig.chat(_body(f"q{i}"), {"session_id": f"s-\udcff{i % 2}" if i % 3 else f"ok{i}"})
        for i in range(24)])
    assert all(r[0] == 200 for r in results)
    s = await wait_idle(rig, 24)
    assert s["quarantined"] == 0 and s["spool_records"] == 0
    sids = {t["session_id"] for t in rig.turns()}
    assert "s-\ufffd0" in sids and "s-\ufffd1" in sids


async def test_malformed_tool_call_in_history_is_stored(rig):
    msgs = [{"role": "user", "content": "a"},
            {"role": "assistant", "content": None, "tool_calls": [{"function": "x"}]},
            {"role": "tool", "content": "r"}]
    for n in (1, 3):
        status, _, _ = await rig.chat({"model": "m", "stream": True, "messages": msgs[:n]},
                                      {"x-session-id": "tc"})
        assert status == 200
    status, _, _ = await rig.chat({"model": "m", "messages": [{"role": {"a": 1}, "content": "x" * 300}]})
    assert status == 200  # found by the fuzz: a dict as role broke the digest cache
    sse = (b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":[1],"function":"x"}]}}]}'
           b'\n\ndata: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\ndata: [DONE]\n\n')
    await rig.chat(_body("tool out"), {"x-fake-raw": base64.b64encode(sse).decode()})
    s = await wait_idle(rig, 4)
    assert s["quarantined"] == 0, quarantine(rig)


# -- 2: secrets are redacted before they are written ----------------------------------------------
SECRETS = ["sk-proj-AbCdEfGhIjKlMnOpQrStUv0123", "ghp_0123456789abcdefghijABCDEFGHIJ",
           "hf_abcdefghijklmnopqrstuvwxyz0123", "AKIAABCDEFGHIJKLMNOP", "tok.en-value_1234567890"]
PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"


async def test_secrets_in_every_position_are_redacted(make_rig, caplog):
    caplog.set_level(logging.INFO)
    rig = await make_rig()
    s0, s1, s2, s3, s4 = SECRETS
    body = _body(f"{s0} rest")  # the fake answers "pong: <first 40 chars>": the response has it too
    body.update(api_key="plain-password-like-value", metadata={"k": s1, "nested": [{"password": "hunter22"}]})
    body["messages"].insert(1, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": orjson.dumps({"key": s2, "pem": PEM}).decode()}}]})
    body["messages"].insert(2, {"role": "tool", "tool_call_id": "c", "content": f"Authorization: Bearer {s4} {s3}"})
    status, _, _ = await rig.chat(body, {"Authorization": f"Bearer {s4}", "session_id": "sec"})
    assert status == 200
    # while the store is down, the spool must not get them either
    disk_full(rig, True)
    body2 = _body(f"{s0} again" + " filler" * 4000)
    await rig.chat(body2, {"session_id": "sec"})
    await rig.stats_when(lambda s: s["spool_records"] > 0, "the turn to be spooled")
    spool = (rig.cfg.data_path / "spool.jsonl").read_bytes()
    disk_full(rig, False)
    await rig.chat(_body("ok"), {"session_id": "sec"})
    await wait_idle(rig, 3)
    t = rig.turns()[0]
    assert t["request_params"]["api_key"] == "[REDACTED]"
    assert t["prompt_token_ids"] is None and t["completion_token_ids"] is None  # they spell it too
    assert rig.turns()[-1]["completion_token_ids"]  # a turn without secrets keeps its ids
    assert "[REDACTED]" in t["response_text"]
    for secret in [*SECRETS, "plain-password-like-value", "hunter22", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"]:
        assert secret.encode() not in spool
        for p in rig.cfg.data_path.rglob("*"):
            if p.is_file():
                assert secret.encode() not in p.read_bytes(), (secret, p)
        assert secret not in caplog.text


async def test_redaction_can_be_turned_off(make_rig):
    rig = await make_rig(**{"proxy.redact_secrets": False})
    await rig.chat(_body(SECRETS[0]))
    await wait_idle(rig, 1)
    assert SECRETS[0] in rig.turns()[0]["request_messages"][1]["content"]


# -- 3: control routes, off-loopback ------------------------------------------------------------
async def test_engine_control_routes_are_not_forwarded(rig):
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/../v1/load_lora_adapter",
                 "/v1/models/..%2Fload_lora_adapter", "/v1/models/%2e%2e/load_lora_adapter"):
        async with rig.client.post(rig.url + path, json={"lora_name": "x", "lora_path": "/tmp"}) as r:
            assert r.status == 404, path
            assert (await r.json())["error"]["type"] == "not_found_error"
    assert not rig.fake.received
    for path in ("/v1/models", "/v1/models?x=1"):
        async with rig.client.get(rig.url + path) as r:
            assert r.status == 200, path


def test_off_loopback_needs_a_token():
    from clawproxy.config import load_config

    with pytest.raises(ConfigError, match="control_token"):
        load_config(None, {"proxy.host": "0.0.0.0"})
    assert load_config(None, {"proxy.host": "0.0.0.0", "proxy.control_token": "t"}).proxy.host == "0.0.0.0"


async def test_off_loopback_requires_the_token_on_the_api_and_does_not_forward_it(make_rig, caplog):
    caplog.set_level(logging.WARNING)
    rig = await make_rig(**{"proxy.host": "0.0.0.0", "proxy.control_token": "t0k"})
    assert "off loopback" in caplog.text
    status, _, _ = await rig.chat(_body("no token"))
    assert status == 401
    status, _, _ = await rig.chat(_body("token"), {"Authorization": "Bearer t0k"})
    assert status == 200
    assert "Authorization" not in rig.fake.received[-1].headers


# -- 7: compressed bodies --------------------------------------------------------------------------
async def test_compressed_bodies(rig):
    raw = orjson.dumps(_body("zipped"))
    for enc, data in (("gzip", gzip.compress(raw)), ("deflate", zlib.compress(raw)),
                      ("deflate", zlib.compress(raw)[2:-4])):
        async with rig.client.post(rig.url + "/v1/chat/completions", data=data, headers={
                "Content-Encoding": enc, "Content-Type": "application/json"}) as r:
            assert r.status == 200, (enc, await r.text())
    async with rig.client.post(rig.url + "/v1/chat/completions", data=raw, headers={
            "Content-Encoding": "gzip", "Content-Type": "application/json"}) as r:
        assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_content_encoding"


async def test_gzip_bomb_is_refused_early_without_stalling_others(make_rig):
    """Four bombs inflate while a normal stream flows through the proxy: each is refused with 413
    past the limit, and the stream never pauses for long (an inflate that held the loop would
    pause it for as long as it ran)."""
    rig = await make_rig(**{"proxy.max_body_bytes": 4 * 1024 * 1024})
    bomb = gzip.compress(b"\0" * (200 * 1024 * 1024), 1)
    release = asyncio.Event()

    async def held_bomb():
        yield bomb[:1024]  # inflates to far below the limit: the bomb is admitted and waits for the rest
        await release.wait()
        yield bomb[1024:]

    async def send_bomb():
        async with rig.client.post(rig.url + "/v1/chat/completions", data=held_bomb(), headers={
                "Content-Encoding": "gzip", "Content-Type": "application/json"}) as r:
            return r.status, await r.json()

    bombs = asyncio.gather(*[send_bomb() for _ in range(4)])
    await until(lambda: rig.app[STATS_KEY].in_flight == 4, "the proxy to admit the four bombs")
    # Long enough to outlast the bombs; read only until they are refused.
    async with rig.client.post(rig.url + "/v1/chat/completions", json=_body("meanwhile"),
                               headers={"x-fake-chunks": "5000", "x-fake-delay-ms": "5"}) as r:
        assert r.status == 200
        await r.content.readline()
        release.set()
        arrivals = [time.perf_counter()]
        async for _ in r.content:
            arrivals.append(time.perf_counter())
            if bombs.done():
                break
    assert bombs.done(), "the stream ended before the bombs were refused: it measured nothing"
    assert all(b[0] == 413 and b[1]["error"]["code"] == "request_too_large" for b in bombs.result())
    longest = max(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))
    assert longest < 1.0, f"the stream paused {longest:.2f} s while the bombs inflated"


# -- 10: an upstream that dies mid-stream or sends garbage ------------------------------------------
@pytest.mark.parametrize("close", [True, False])
async def test_stream_cut_before_done_is_an_error_in_band_and_in_the_store(rig, close):
    sse = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"half"}}]}\n\n'
    h = {"x-fake-raw": base64.b64encode(sse).decode(), "x-fake-raw-close": "1" if close else "0"}
    status, _, data = await rig.chat(_body("cut"), h)
    assert status == 200
    assert b'"error"' in data and b"before [DONE]" in data
    await wait_idle(rig, 1)
    [t] = rig.turns()
    assert t["status"] == "error" and "before [DONE]" in t["error"] and t["response_text"] == "half"


async def test_garbage_stream_is_stored_as_an_error(rig):
    sse = b"data: this is not json\n\ndata: {broken\n\ndata: [DONE]\n\n"
    await rig.chat(_body("garbage"), {"x-fake-raw": base64.b64encode(sse).decode()})
    await wait_idle(rig, 1)
    [t] = rig.turns()
    assert t["status"] == "error" and "not JSON" in t["error"]


async def test_done_inside_generated_text_is_not_the_end(rig):
    sse = (b'data: {"choices":[{"index":0,"delta":{"content":"say data: [DONE] ok"}}]}\n\n'
           b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
    await rig.chat(_body("x"), {"x-fake-raw": base64.b64encode(sse).decode()})
    await wait_idle(rig, 1)
    [t] = rig.turns()
    assert t["status"] == "ok" and t["finish_reason"] == "stop"


# -- 11: slow clients ------------------------------------------------------------------------------
async def test_short_body_times_out_with_408(make_rig):
    rig = await make_rig(**{"proxy.body_timeout_s": 0.5})
    req = http_request("POST", b"/v1/chat/completions", b"", [(b"Content-Type", b"application/json")])
    req = req.replace(b"Content-Length: 0", b"Content-Length: 100") + b'{"model":'
    t = time.perf_counter()
    status, out = await asyncio.to_thread(raw_request, _port(rig), req, 5.0)
    assert status == 408 and b"body_timeout_s" in out
    assert time.perf_counter() - t < 3


async def test_header_only_connections_are_closed(make_rig):
    rig = await make_rig(**{"proxy.header_timeout_s": 0.5})

    def hold() -> bool:
        with socket.create_connection(("127.0.0.1", _port(rig)), timeout=5) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            try:
                return s.recv(100) == b""  # closed by the proxy
            except TimeoutError:
                return False

    closed = await asyncio.gather(*[asyncio.to_thread(hold) for _ in range(10)])
    assert all(closed)


# -- 12: logs and header bytes ---------------------------------------------------------------------
async def test_parser_rejects_log_no_traceback(rig, caplog):
    caplog.set_level(logging.INFO)
    for junk in (b"GET /\x00 HTTP/1.1\r\n\r\n", b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
                 b"\x16\x03\x01garbage\r\n\r\n"):
        await asyncio.to_thread(raw_request, _port(rig), junk, 3.0)
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_error_answers_are_json_even_from_the_http_parser(rig):
    # aiohttp's parser refusals and a missing static file were plain text, which an OpenAI client
    # cannot parse; every error the proxy answers is the JSON error object
    port = _port(rig)
    junk = [b"GET /\x00 HTTP/1.1\r\n\r\n", b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            b"\x16\x03\x01garbage\r\n\r\n", b"GET / HTTP/1.1\r\nHost: a\r\nBad Header\r\n\r\n",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"y" * 70000 + b"\r\n\r\n",
            http_request("GET", b"/clawproxy/ui/static/nope.js"),
            http_request("GET", b"/clawproxy/ui/static/.hidden")]
    for req in junk:
        status, out = await asyncio.to_thread(raw_request, port, req, 3.0)
        head, _, body = out.partition(b"\r\n\r\n")
        assert status is not None and 400 <= status < 500, out[:300]
        assert b"Content-Type: application/json" in head, out[:300]
        err = orjson.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    status, _, _ = await rig.chat(_body("still serving"))
    assert status == 200


async def test_non_utf8_header_bytes_are_forwarded_intact(rig):
    await rig.chat(_body("bytes"), {"Authorization": "Bearer sk-\udce9\udcff", "x-other": "\udcc3"})
    got = rig.fake.received[-1].headers
    assert got["Authorization"].encode("utf-8", "surrogateescape") == b"Bearer sk-\xe9\xff"
    assert got["x-other"].encode("utf-8", "surrogateescape") == b"\xc3"


# -- 8: a full disk -------------------------------------------------------------------------------
async def test_full_disk_serves_counts_the_loss_and_recovers(rig):
    await rig.chat(_body("before"))
    await wait_idle(rig, 1)
    for name in ("spool.jsonl", "quarantine.jsonl"):  # the disk refuses these too
        (rig.cfg.data_path / name).mkdir()
    disk_full(rig, True)
    try:
        for i in range(3):
            status, _, data = await rig.chat(_body(f"lost {i}" + " filler" * 4000))
            assert status == 200 and b"[DONE]" in data
        await rig.stats_when(lambda s: s["turns_lost"] == 3, "the three turns to be counted lost")
        async with rig.client.get(rig.url + "/clawproxy/health") as r:
            h = await r.json()
        assert h["turns_lost"] == 3 and h["recording"] == "degraded" and not h["store_ok"], h
        assert "full" in " ".join(h["problems"])
    finally:
        disk_full(rig, False)
        for name in ("spool.jsonl", "quarantine.jsonl"):
            (rig.cfg.data_path / name).rmdir()
    await rig.chat(_body("after"))
    await wait_idle(rig, 2)
    assert [t["response_text"].split(" part")[0] for t in rig.turns()] == ["pong: before", "pong: after"]
    assert (await rig.stats())["store_ok"]


async def test_store_rollback_keeps_the_real_error(tmp_path):
    import sqlite3

    s = Store(tmp_path / "x.db")
    n = s.query_one("PRAGMA page_count")["page_count"]
    s.execute(f"PRAGMA max_page_count={n}")
    with pytest.raises(sqlite3.OperationalError, match="full"), s.transaction() as c:
        c.execute("INSERT INTO events (ts, kind, data) VALUES (0, 'x', ?)", ("y" * 100000,))
    s.close()


async def test_recorder_journal_replays_turns_a_kill_left(tmp_path):
    from clawproxy.config import load_config
    from clawproxy.proxy.journal import journal_entry
    from clawproxy.proxy.recorder import Recorder
    from clawproxy.proxy.tap import Capture

    cfg = load_config(None, {"data_dir": str(tmp_path / "data"), "proxy.upstream": "http://127.0.0.1:9"})
    cfg.data_path.mkdir(parents=True)
    caps = []
    for rid in ("a", "b"):
        c = Capture(rid, time.time(), "/v1/chat/completions", 0.0, stream=True, done=True,
                    raw_body=orjson.dumps(_body(rid)), body=_body(rid), http_status=200, t_end=0.1)
        c.chunks.append(b'data: {"choices":[{"index":0,"delta":{"content":"hi ' + rid.encode()
                        + b'"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n')
        caps.append(c)
    torn = journal_entry(caps[1])
    (cfg.data_path / "journal.bin").write_bytes(journal_entry(caps[0]) + torn + torn[:-5])
    rec = Recorder(cfg)
    await rec.start()
    await rec.close()
    s = Store(cfg.db_path)
    try:
        assert [r["response_text"] for r in s.query("SELECT response_text FROM turns ORDER BY id")] == ["hi a", "hi b"]
    finally:
        s.close()
    assert (cfg.data_path / "journal.bin").stat().st_size == 0


# -- sessions delete: gone from the database, its free pages and the WAL --------------------------
def _files_with(data_dir, needle: bytes) -> list[str]:
    return [p.name for p in data_dir.iterdir() if p.is_file() and needle in p.read_bytes()]


async def test_sessions_delete_leaves_nothing_in_wal_or_free_pages(rig):
    from click.testing import CliRunner

    from clawproxy.cli import main

    await rig.chat(_body("SECRETWORD one"), {"session_id": "gone"})
    await rig.chat(_body("kept"), {"session_id": "kept"})
    await wait_idle(rig, 2)
    d = rig.cfg.data_path
    assert _files_with(d, b"SECRETWORD")  # in the WAL and/or the database before
    reader = Store(rig.cfg.db_path)
    reader.execute("BEGIN")
    reader.query("SELECT COUNT(*) FROM turns")  # a reader (the judge, say) holds a snapshot
    r = CliRunner().invoke(main, ["sessions", "delete", "gone", "--yes", "--data-dir", str(d)])
    # The WAL cannot be emptied under a reader: a clear error, not a silent "deleted".
    assert r.exit_code != 0 and "busy" in r.output and "--purge" in r.output, r.output
    reader.execute("COMMIT")
    reader.close()
    await rig.app.shutdown()
    await rig.app.cleanup()
    r = CliRunner().invoke(main, ["sessions", "delete", "--purge", "--data-dir", str(d)])
    assert r.exit_code == 0, r.output
    assert _files_with(d, b"SECRETWORD") == []
    assert _files_with(d, b"pong: kept")


# -- logs and a start on a broken store -------------------------------------------------------------
def test_log_file_is_private_rotated_and_redacted(tmp_path, monkeypatch):
    from clawproxy import supervisor
    from clawproxy.config import load_config

    monkeypatch.setattr(supervisor, "LOG_MAX_BYTES", 4000)
    cfg = load_config(None, {"data_dir": str(tmp_path / "data")})
    root = logging.getLogger()
    before = list(root.handlers)
    monkeypatch.setattr(root, "handlers", [h for h in before if not getattr(h, "_clawproxy", False)])
    try:
        supervisor._setup_logging(cfg)
        for i in range(100):
            logging.getLogger("clawproxy.test").warning("line %d with %s", i, SECRETS[0])
    finally:
        for h in [h for h in root.handlers if getattr(h, "_clawproxy", False)]:
            h.close()
    logs = sorted((tmp_path / "data" / "logs").iterdir())
    assert [p.name for p in logs][:2] == ["clawproxy.log", "clawproxy.log.1"]
    for p in logs:
        assert oct(p.stat().st_mode & 0o777) == "0o600", p
        assert SECRETS[0].encode() not in p.read_bytes() and b"[REDACTED]" in p.read_bytes()


def test_start_serves_with_a_broken_store(tmp_path):
    import os
    import subprocess
    import sys
    import urllib.request

    from tests.rig.proc_rig import REPO, FakeProc, free_port

    data = tmp_path / "data"
    (data / "clawproxy.db").mkdir(parents=True)  # the database cannot be opened
    fake, port = FakeProc(), free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "clawproxy.cli", "start", "--upstream", fake.url,
                             "--port", str(port), "--data-dir", str(data), "--no-judge", "--no-train"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        def answered() -> dict | None:
            try:
                with opener.open(f"http://127.0.0.1:{port}/clawproxy/health", timeout=5) as r:
                    return orjson.loads(r.read())
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()
                return None

        health = until_sync(answered, "the proxy to answer /clawproxy/health", 30, poll=0.2)
        assert health["store_ok"] is False and health["recording"] == "degraded", health
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                     data=orjson.dumps(_body("served")),
                                     headers={"Content-Type": "application/json"})
        with opener.open(req, timeout=10) as r:
            assert r.status == 200 and b"pong: served" in r.read()
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0].decode()
        fake.close()
    assert "RECORDING IS DEGRADED" in out


# -- issue 25: redaction by structure, and no secret in the journal -------------------------------
def _hold_recorder(rig, monkeypatch):
    """Stop the recorder's worker until the returned event is set (the journal keeps the turns)."""
    import threading

    from clawproxy.proxy.app import RECORDER_KEY

    rec = rig.app[RECORDER_KEY]
    gate = threading.Event()
    orig = rec._process

    def held(batch):
        gate.wait(20)
        return orig(batch)

    monkeypatch.setattr(rec, "_process", held)
    return rec, gate


async def test_every_secret_shape_is_redacted_everywhere_and_counts_stay(make_rig, monkeypatch, caplog):
    import random

    from tests.rig.secret_shapes import CLEAN, shapes

    caplog.set_level(logging.DEBUG)
    rig = await make_rig()
    rec, gate = _hold_recorder(rig, monkeypatch)
    cases = shapes(random.Random(25))
    assert len(cases) >= 40
    for label, _, body in cases:
        status, _, _ = await rig.chat(body, {"x-session-id": label})
        assert status == 200, label
    await rig.chat(CLEAN, {"x-session-id": "clean"})
    journal = rec.journal_path.read_bytes()  # every turn is journaled, none stored yet
    assert journal.count(b"CJ1 ") == len(cases) + 1
    gate.set()
    await wait_idle(rig, len(cases) + 1)
    from click.testing import CliRunner

    from clawproxy.cli import main

    export = CliRunner().invoke(main, ["sessions", "export", "--data-dir", str(rig.cfg.data_dir)]).output
    files = {p.name: p.read_bytes() for p in rig.cfg.data_path.rglob("*") if p.is_file()}
    leaks = [(label, where) for label, secret, _ in cases
             for where, data in [("journal", journal), ("export", export.encode()),
                                 ("log", caplog.text.encode()), *files.items()]
             if secret.encode() in data]
    assert leaks == []
    turns = {t["session_id"]: t for t in rig.turns()}
    assert len(turns) == len(cases) + 1
    assert turns["member_password_number"]["request_params"]["metadata"] == {"password": "[REDACTED]"}
    assert turns["member_auth_token"]["request_params"]["metadata"] == {"auth": "[REDACTED]"}
    args = json.loads(turns["tool_args_password"]["request_messages"][2]["tool_calls"][0]["function"]["arguments"])
    assert args == {"config": {"password": "[REDACTED]", "retries": 3}}
    # what only looks like a secret stays, and so do the token counts and ids the trainer needs
    clean = turns["clean"]
    assert clean["request_messages"] == CLEAN["messages"]
    assert clean["request_params"]["max_tokens"] == 77
    assert clean["completion_token_ids"] and clean["prompt_token_ids"] and clean["completion_logprobs"]
    assert clean["usage"]["prompt_tokens"] and clean["usage"]["completion_tokens"]
    assert all(t["completion_token_ids"] is None for sid, t in turns.items() if sid != "clean")


async def test_a_killed_proxys_journal_replays_a_redacted_turn_without_its_token_ids(tmp_path):
    from clawproxy.config import load_config
    from clawproxy.proxy.journal import journal_entry
    from clawproxy.proxy.recorder import Recorder
    from clawproxy.proxy.redact import Redactor
    from clawproxy.proxy.tap import Capture

    cfg = load_config(None, {"data_dir": str(tmp_path / "data"), "proxy.upstream": "http://127.0.0.1:9"})
    cfg.data_path.mkdir(parents=True)
    body = _body("hi", metadata={"db_password": "Zx81hunter2"})
    c = Capture("r1", time.time(), "/v1/chat/completions", 0.0, stream=True, done=True,
                raw_body=orjson.dumps(body), body=body, http_status=200, t_end=0.1)
    c.chunks.append(b'data: {"choices":[{"index":0,"delta":{"content":"sk-live0123456789abcdefXYZ"},'
                    b'"finish_reason":"stop"}],"token_ids":[5,6]}\n\ndata: [DONE]\n\n')
    entry = journal_entry(c, Redactor())
    assert b"Zx81hunter2" not in entry and b"sk-live0123456789abcdefXYZ" not in entry
    (cfg.data_path / "journal.bin").write_bytes(entry)
    rec = Recorder(cfg)
    await rec.start()
    await rec.close()
    s = Store(cfg.db_path)
    try:
        [t] = s.query("SELECT * FROM turns")
    finally:
        s.close()
    assert (t["response_text"], t["completion_token_ids"]) == ("[REDACTED]", None)


async def test_the_journal_is_emptied_after_the_queue_overflowed(make_rig, monkeypatch):
    rig = await make_rig(**{"proxy.recorder_queue_size": 1})
    rec, gate = _hold_recorder(rig, monkeypatch)
    for i in range(5):  # one in the held batch, one queued, three overflow
        status, _, _ = await rig.chat(_body(f"turn {i}"), {"x-session-id": f"o{i}"})
        assert status == 200
    assert (await rig.stats())["queue_overflow"] == 3
    gate.set()
    s = await wait_idle(rig, 5)
    assert s["turns_recorded"] == 5
    await until(lambda: rec.journal_path.stat().st_size == 0, "the journal to be emptied")
    assert rec.journal_path.stat().st_size == 0
    assert sorted(t["session_id"] for t in rig.turns()) == [f"o{i}" for i in range(5)]
