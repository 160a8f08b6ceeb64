"""clawproxy/httpjson.py against a real aiohttp server on loopback."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from clawproxy.errors import EngineError, UpstreamError
from clawproxy.httpjson import answers_ok, request_json
from tests.net import held_port


@pytest.fixture
async def url(aiohttp_server):
    async def echo(request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        return web.json_response({"body": body, "query": dict(request.query),
                                  "auth": request.headers.get("Authorization")})

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "no such adapter"}}, status=404)

    app = web.Application()
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/refuse", refuse)
    app.router.add_get("/empty", lambda r: web.Response())
    srv = await aiohttp_server(app)
    return str(srv.make_url("")).rstrip("/")


async def test_json_in_and_out(url):
    out = await asyncio.to_thread(request_json, "POST", url + "/echo", {"a": 1}, token="t",
                                  query={"mode": "keep"})
    assert out == {"body": {"a": 1}, "query": {"mode": "keep"}, "auth": "Bearer t"}
    assert await asyncio.to_thread(request_json, "GET", url + "/empty") is None


async def test_an_error_status_raises_the_callers_error_with_the_servers_message(url):
    with pytest.raises(EngineError) as info:
        await asyncio.to_thread(request_json, "GET", url + "/refuse", error=EngineError)
    assert info.value.status == 404 and info.value.message == "GET /refuse refused (404): no such adapter"
    assert not await asyncio.to_thread(answers_ok, url + "/refuse")


def test_unreachable_is_a_503():
    with held_port() as port, pytest.raises(UpstreamError) as info:
        request_json("GET", f"http://127.0.0.1:{port}/health", timeout=2)
    assert info.value.status == 503 and "unreachable" in info.value.message
    assert not answers_ok(f"http://127.0.0.1:{port}/health")


async def test_http_proxy_is_not_used(url, monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("no_proxy", "")
    assert await asyncio.to_thread(answers_ok, url + "/echo")
