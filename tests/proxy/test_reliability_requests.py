"""Issue 15's reproducers, what clients send: engine control routes and the off-loopback token,
compressed bodies and gzip bombs, slow clients, junk the HTTP parser refuses and header bytes that
are not UTF-8. The proxy answers each (in JSON) and keeps serving; each test failed before its fix."""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
import time
import zlib

import orjson
import pytest

from clawproxy.errors import ConfigError
from clawproxy.proxy.app import STATS_KEY
from tests.proxy.test_proxy_forwarding import _body
from tests.rig.proc_rig import http_request, raw_request
from tests.waits import until


def _port(rig) -> int:
    return int(rig.url.rsplit(":", 1)[1])


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
