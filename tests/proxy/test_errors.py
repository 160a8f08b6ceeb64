"""Failures: upstream down / slow / erring, bad requests, client disconnects. Never a traceback."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson
from aiohttp import web

from clawproxy.proxy.app import STATS_KEY
from tests.net import held_port
from tests.proxy.test_proxy_forwarding import _body
from tests.rig.fake_upstream import FakeUpstream
from tests.waits import until


def _is_openai_error(raw: bytes) -> dict:
    obj = orjson.loads(raw)
    assert set(obj["error"]) >= {"message", "type", "code"}, obj
    assert b"Traceback" not in raw
    return obj["error"]


async def test_upstream_down_is_502_and_recorded(make_rig):
    with held_port() as dead:  # bound, never listening: connections are refused
        rig = await make_rig(upstream=f"http://127.0.0.1:{dead}")
        status, _, raw = await rig.chat(_body(), {"x-session-id": "down"})
        assert status == 502
        assert _is_openai_error(raw)["type"] == "upstream_error"
        async with rig.client.get(rig.url + "/v1/models") as r:
            assert r.status == 502
    await rig.wait_recorded(1)
    [t] = rig.turns()
    assert (t["status"], t["http_status"], t["reason"], t["trainable"]) == ("error", 502, "error", 0)


async def test_engine_restarting_is_503_with_retry_after(make_rig):
    with held_port() as dead:
        rig = await make_rig(upstream=f"http://127.0.0.1:{dead}", upstream_ready=lambda: False)
        status, headers, raw = await rig.chat(_body())
    assert status == 503 and headers["Retry-After"] == "1"
    _is_openai_error(raw)


async def test_polls_of_a_starting_engine_log_one_warning_per_not_ready_period(make_rig, caplog):
    caplog.set_level(logging.DEBUG, logger="clawproxy.proxy")

    def not_ready() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "not ready yet" in r.getMessage() and r.levelno >= logging.WARNING]

    def polled(n: int):
        return asyncio.gather(*[rig.client.get(rig.url + "/v1/models") for _ in range(n)])

    with held_port() as port:
        rig = await make_rig(upstream=f"http://127.0.0.1:{port}", upstream_ready=lambda: False)
        for r in await polled(50):
            assert r.status == 503
            r.release()
        assert len(not_ready()) == 1
        # the engine is up: the next answer ends the period, with its count
        runner = web.AppRunner(FakeUpstream().app())
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
        try:
            async with rig.client.get(rig.url + "/v1/models") as r:
                assert r.status == 200
        finally:
            await runner.cleanup()
        assert "50 request(s) got 503" in caplog.text
        # a restart: one more warning, however many polls
        for r in await polled(20):
            assert r.status == 503
            r.release()
    assert len(not_ready()) == 2


async def test_upstream_timeout_is_504(make_rig):
    rig = await make_rig(**{"proxy.read_timeout_s": 0.3})
    status, _, raw = await rig.chat(_body(), {"x-fake-mode": "hang", "x-session-id": "slow"})
    assert status == 504
    assert _is_openai_error(raw)["type"] == "upstream_timeout"
    await rig.wait_recorded(1)
    assert rig.turns()[0]["http_status"] == 504


async def test_upstream_silence_mid_stream_ends_stream_with_error(make_rig):
    rig = await make_rig(**{"proxy.read_timeout_s": 0.3})
    status, _, raw = await rig.chat(_body(), {"x-fake-mode": "hang-mid", "x-session-id": "mid"})
    assert status == 200
    assert b'"error"' in raw and b"[DONE]" not in raw
    await rig.wait_recorded(1)
    t = rig.turns()[0]
    assert t["status"] == "error" and "timeout" in t["error"]


async def test_upstream_error_status_passed_through(rig):
    for code in (500, 429, 400):
        status, headers, raw = await rig.chat(_body(), {"x-fake-status": str(code), "x-session-id": f"e{code}"})
        assert status == code
        assert _is_openai_error(raw)["message"] == f"fake failure {code}"
        if code == 429:
            assert headers["Retry-After"] == "1"
    await rig.wait_recorded(3)
    assert [(t["status"], t["http_status"]) for t in rig.turns()] == [("error", 500), ("error", 429), ("error", 400)]


async def test_bad_requests_are_clear_4xx(make_rig):
    rig = await make_rig(**{"proxy.max_body_bytes": 4096})
    url = rig.url + "/v1/chat/completions"
    cases = [
        (b"{not json", "application/json", 400, "invalid_json"),
        (b'{"messages": "x"}', "application/json", 400, "invalid_messages"),
        (b"[1, 2]", "application/json", 400, "invalid_json"),
        (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', "application/json", 400, "invalid_utf8"),
        (b'{"messages": []}', "text/plain", 415, "unsupported_media_type"),
        (b'{"messages": [], "pad": "' + b"x" * 5000 + b'"}', "application/json", 413, "request_too_large"),
    ]
    for data, ctype, status, code in cases:
        async with rig.client.post(url, data=data, headers={"Content-Type": ctype}) as r:
            raw = await r.read()
            assert r.status == status, (data[:40], raw)
            assert _is_openai_error(raw)["code"] == code
    # Chunked upload (no Content-Length) over the limit is refused too.
    async def gen():
        yield b'{"messages": [], "pad": "'
        yield b"y" * 6000
        yield b'"}'
    async with rig.client.post(url, data=gen(), headers={"Content-Type": "application/json"}) as r:
        assert r.status == 413
        _is_openai_error(await r.read())
    # The proxy is still healthy and serving.
    status, _, _ = await rig.chat(_body())
    assert status == 200
    assert rig.fake.received[-1].body["messages"][1]["content"] == "hello"


async def _disconnect_during(rig, mode: str) -> None:
    session = aiohttp.ClientSession()
    try:
        resp = await session.post(rig.url + "/v1/chat/completions", json=_body(),
                                  headers={"x-fake-mode": mode, "x-session-id": mode})
        if mode == "hang-mid":
            assert resp.status == 200
            await resp.content.readany()  # the stream has started
        resp.close()
    except TimeoutError:
        pass
    finally:
        await session.close()


async def test_client_disconnect_mid_stream_aborts_upstream_and_records(rig):
    await _disconnect_during(rig, "hang-mid")
    await rig.wait_recorded(1)
    [t] = rig.turns()
    assert (t["status"], t["reason"], t["trainable"]) == ("aborted", "aborted", 0)
    assert t["response_text"] == "pong: hello"  # the part that was streamed is kept
    assert t["error"] == "client disconnected"
    # the upstream request was cancelled, not left running
    await until(lambda: rig.fake.disconnects, "the upstream request to be cancelled")
    assert rig.fake.disconnects == 1


async def test_client_disconnect_before_headers(rig):
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5))
    try:
        await session.post(rig.url + "/v1/chat/completions", json=_body(),
                           headers={"x-fake-mode": "hang", "x-session-id": "pre"})
    except TimeoutError:
        pass
    finally:
        await session.close()
    await rig.wait_recorded(1)
    assert rig.turns()[0]["status"] == "aborted"


async def test_control_endpoints(make_rig):
    rig = await make_rig()
    async with rig.client.get(rig.url + "/clawproxy/health") as r:
        assert r.status == 200 and (await r.json())["status"] == "ok"
    tok = await make_rig(**{"proxy.control_token": "t0k"})
    async with tok.client.get(tok.url + "/clawproxy/stats") as r:
        assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    async with tok.client.get(tok.url + "/clawproxy/stats", headers={"Authorization": "Bearer t0k"}) as r:
        assert r.status == 200 and "queue_depth" in await r.json()


async def test_client_hanging_up_mid_body_leaves_an_aborted_turn(rig):
    # Content-Length promises more than is sent, then the socket closes: the handler is cancelled
    # inside the body read, and that turn is still recorded as aborted and counted
    port = int(rig.url.rsplit(":", 1)[1])
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"x-session-id: cut\r\nContent-Length: 5000\r\n\r\n")

    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + b'{"model": "m", "messages": [{"role": "user", "content": "')
    await writer.drain()
    # Admitted and counted, then straight into the body read (no await between): hang up there.
    await until(lambda: rig.app[STATS_KEY].in_flight == 1, "the proxy to admit the request")
    writer.close()
    await writer.wait_closed()
    await rig.wait_recorded(1)
    [t] = rig.turns()
    assert (t["status"], t["reason"], t["trainable"]) == ("aborted", "aborted", 0)
    assert t["error"] == "client disconnected while sending the body"
    s = await rig.stats()
    assert (s["aborted"], s["in_flight"]) == (1, 0)
    assert rig.fake.received == []  # nothing was forwarded
