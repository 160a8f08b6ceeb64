"""The HTTP edge both servers share (clawproxy/edge.py): the real proxy and the real engine app (a
tiny model) answer errors alike and guard their control routes with the same check."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from clawproxy.edge import host_allowed, is_loopback

TOKEN = "t0k"


@pytest.fixture
async def engine_url(tiny_model_dir, aiohttp_server):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clawproxy.engine.embedded.core import Engine
    from clawproxy.engine.server import ServerSettings, create_app

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    engine = Engine(model, AutoTokenizer.from_pretrained(tiny_model_dir), threads=1)
    settings = ServerSettings("tiny", str(tiny_model_dir), 2048, control_token=TOKEN)
    srv = await aiohttp_server(create_app(engine, settings))
    return str(srv.make_url("")).rstrip("/")


async def raw_get(url: str, path: str, authorization: bytes) -> tuple[int, dict]:
    """GET with the Authorization header as raw bytes (an HTTP client would refuse non-ASCII)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: " + host.encode() + b"\r\nConnection: close\r\n"
                 b"Authorization: " + authorization + b"\r\n\r\n")
    raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body)


async def test_non_ascii_authorization_is_a_401_on_both_servers(make_rig, engine_url):
    rig = await make_rig(**{"proxy.control_token": TOKEN})
    for url, path in ((rig.url, "/clawproxy/stats"), (engine_url, "/is_paused")):
        status, body = await raw_get(url, path, b"Bearer t\xe9k \xff")
        assert status == 401, (path, body)
        assert "Bearer" in body["error"]["message"]
    status, body = await raw_get(rig.url, "/clawproxy/health", b"Bearer " + TOKEN.encode())
    assert status == 200 and body["status"] == "ok"


async def test_error_json_has_one_shape_on_both_servers(make_rig, engine_url):
    rig = await make_rig(**{"proxy.control_token": TOKEN})
    async with rig.client.get(rig.url + "/clawproxy/stats", headers={"Authorization": "Bearer no"}) as r:
        proxy = (r.status, await r.json())
    async with rig.client.get(engine_url + "/is_paused", headers={"Authorization": "Bearer no"}) as r:
        engine = (r.status, await r.json())
    assert proxy[0] == engine[0] == 401
    assert set(proxy[1]) == set(engine[1]) == {"error"}
    assert set(proxy[1]["error"]) == set(engine[1]["error"]) == {"message", "type", "param", "code"}
    # the proxy speaks OpenAI's dialect, the engine vLLM's (code: the HTTP status)
    assert (proxy[1]["error"]["type"], proxy[1]["error"]["code"]) == ("authentication_error", "invalid_api_key")
    assert (engine[1]["error"]["type"], engine[1]["error"]["code"]) == ("AuthenticationError", 401)
    async with rig.client.post(engine_url + "/pause?mode=nope", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        assert r.status == 400
        assert (await r.json())["error"] == {"message": "mode='nope': use keep, wait or abort",
                                             "type": "BadRequestError", "param": "mode", "code": 400}


@pytest.mark.parametrize("remote, ok", [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True),
                                        ("::ffff:127.0.0.1", True), ("10.0.0.1", False),
                                        ("::ffff:10.0.0.1", False), (None, False), ("localhost", False)])
def test_loopback(remote, ok):
    assert is_loopback(remote) is ok



@pytest.mark.parametrize("host, ok", [
    ("127.0.0.1:8080", True), ("localhost:8080", True), ("LOCALHOST", True), ("[::1]:8080", True),
    ("app.localhost:1", True), ("10.1.2.3:8080", True), ("[fe80::1]:80", True), ("proxy.lan:8080", True),
    ("evil.example:8080", False), ("evil.example", False), ("localhost.evil.example", False),
    ("127.0.0.1.nip.io", False), ("[::1", False), ("", False), (None, False)])
def test_host_names_a_dns_rebinding_page_cannot_use(host, ok):
    assert host_allowed(host, {"proxy.lan"}) is ok
