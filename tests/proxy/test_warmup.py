"""The engine's warm-up (clawproxy/proxy/warmup.py): after a restart and after a publish, the stable
part of the system prompt last served goes to the engine once per route, under the route's model
name; a request that arrives during a warm-up ends it and is answered at once."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web

from clawproxy.proxy.app import ROUTER_KEY, WARMUP_KEY
from clawproxy.proxy.warmup import stable_part
from tests.engine.test_vllm_contract import write_adapter
from tests.fakes.fake_vllm import CALLS, create_fake_vllm
from tests.proxy.test_proxy_routing import _publish
from tests.waits import until

MODEL = "Qwen/Qwen3-4B"
STABLE = ("<!-- openclaw:attempt:STABLE -->\nYou are a personal assistant running inside OpenClaw.\n"
          "## Tooling\nread, write.\n<!-- /openclaw:attempt:STABLE -->")
SYSTEM = STABLE + "\n<!-- openclaw:attempt:DYNAMIC -->\nRuntime: 2026-12-07 21:00\n<!-- /openclaw:attempt:DYNAMIC -->"
ASK = {"model": MODEL, "max_tokens": 3,
       "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}


def test_the_stable_part_of_a_recorded_system_prompt():
    def msgs(*m):
        return json.dumps(list(m))

    assert stable_part(msgs({"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"})) == STABLE
    assert stable_part(msgs({"role": "system", "content": "Be brief."})) == "Be brief."  # no marks: all of it
    assert stable_part(msgs({"role": "user", "content": "hi"})) is None
    assert stable_part(msgs({"role": "system", "content": [{"type": "text", "text": "x"}]})) is None
    assert stable_part(None) is None and stable_part("not json") is None
    assert stable_part([{"role": "system", "content": SYSTEM}]) == STABLE  # as the store gives it


def _warmups(app) -> list[tuple[str, list]]:
    return [(b["model"], b["messages"]) for m, p, b in app[CALLS]
            if p == "/v1/chat/completions" and b.get("max_tokens") == 1]


async def test_a_restart_and_a_publish_each_warm_the_stable_prompt_once(aiohttp_server, make_rig, tmp_path):
    vllm = await aiohttp_server(create_fake_vllm(model=MODEL))
    up = {"ok": True}
    rig = await make_rig(upstream=str(vllm.make_url("")).rstrip("/"), upstream_ready=lambda: up["ok"], **{
        "engine.kind": "vllm", "engine.model": MODEL, "trainer.finetune": "lora"})
    warmup = rig.app[WARMUP_KEY]
    status, _, body = await rig.chat(ASK)
    assert status == 200, body
    await rig.wait_recorded(1)
    assert _warmups(vllm.app) == []  # at start nothing had been served: the first request prefilled it

    up["ok"] = False  # the engine restarts
    await until(lambda: not warmup.warm, "the warm-up to see the engine down")
    up["ok"] = True
    await until(lambda: warmup.warmed == 1, "a warm-up after the restart", timeout=30)
    assert _warmups(vllm.app) == [(MODEL, [{"role": "system", "content": STABLE}])]

    await _publish(rig, vllm.app, write_adapter(tmp_path / "v1"))
    await until(lambda: warmup.warmed == 2, "a warm-up after the publish", timeout=30)
    assert _warmups(vllm.app)[1:] == [("clawproxy", [{"role": "system", "content": STABLE}])]
    await asyncio.sleep(2.5)  # two more polls: nothing is cold, nothing is sent again
    assert len(_warmups(vllm.app)) == 2 and warmup.warmed == 2


async def test_no_warm_up_in_front_of_a_server_clawproxy_does_not_run(make_rig):
    rig = await make_rig()  # no upstream_ready: an attached server
    assert WARMUP_KEY not in rig.app


@pytest.fixture
async def slow_engine(aiohttp_server):
    """An engine whose warm-ups take 30 s, unless their client hangs up, and whose answers are instant."""
    seen: list[str] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("max_tokens") == 1:
            seen.append("warm-up started")
            try:
                for _ in range(300):
                    await asyncio.sleep(0.1)
                    if request.transport is None or request.transport.is_closing():
                        seen.append("warm-up ended by its client")
                        return web.Response(status=499)
            except asyncio.CancelledError:  # the test server cancels the handler of a client that left
                seen.append("warm-up ended by its client")
                raise
            seen.append("warm-up finished")
        else:
            seen.append("answered")
        return web.json_response({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": "ok"}}],
                                  "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/"), seen


async def test_a_request_ends_a_running_warm_up_and_is_answered_at_once(make_rig, slow_engine):
    url, seen = slow_engine
    up = {"ok": True}
    rig = await make_rig(upstream=url, upstream_ready=lambda: up["ok"], **{"engine.model": MODEL})
    warmup = rig.app[WARMUP_KEY]
    assert (await rig.chat(ASK))[0] == 200
    await rig.wait_recorded(1)
    up["ok"] = False
    await until(lambda: not warmup.warm, "the warm-up to see the engine down")
    up["ok"] = True
    await until(lambda: "warm-up started" in seen, "a warm-up to start", timeout=30)
    t0 = time.monotonic()
    status, _, body = await rig.chat(ASK)
    assert status == 200, body
    assert time.monotonic() - t0 < 5.0  # not behind the 30 s warm-up
    await until(lambda: "warm-up ended by its client" in seen, "the engine to see the warm-up's client leave", timeout=30)
    assert warmup.warmed == 0 and (MODEL, 0) not in warmup.warm
    # idle again: it warms the route again (here the slow engine would take 30 s)
    await until(lambda: seen.count("warm-up started") == 2, "the warm-up to start again once idle", timeout=30)
    assert rig.app[ROUTER_KEY].target(None).model == MODEL
