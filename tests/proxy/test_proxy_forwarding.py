"""Forwarding: SSE passed through event for event, non-stream bodies, other /v1 paths, headers."""

from __future__ import annotations

import orjson

from clawproxy.proxy.sse import event_data, split_events

CTX_MSG = {"role": "user", "content": [{"type": "text", "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nx\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"}]}


def _events(raw: bytes) -> list[bytes]:
    events, rest = split_events(raw)
    assert rest == b""
    return events


def _body(text: str = "hello", **kw):
    return {"model": "fake-model", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": text}, CTX_MSG],
            **kw}


async def test_stream_passthrough_strips_only_what_we_added(rig):
    status, headers, raw = await rig.chat(_body(), {"Authorization": "Bearer sk-secret", "x-fake-chunks": "5"})
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    # The upstream was asked for token ids and log-probs ...
    sent = rig.fake.received[-1]
    assert sent.body["logprobs"] is True and sent.body["return_token_ids"] is True
    assert sent.headers["Authorization"] == "Bearer sk-secret"
    # ... and the client gets exactly what the upstream sends to a client that did not ask.
    expected = rig.fake.events(_body(), rig.fake.build_chunks(_body(), "text", 5))
    got = _events(raw)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        gd, ed = event_data(g), event_data(e)
        if gd == b"[DONE]":
            assert ed == b"[DONE]"
            continue
        assert orjson.loads(gd) == orjson.loads(ed)
    assert b"token_ids" not in raw and b'"logprob"' not in raw


async def test_untouched_events_are_byte_identical(rig):
    # The client asked for log-probs and token ids itself: nothing is stripped, bytes are identical.
    body = _body(logprobs=True, return_token_ids=True)
    status, _, raw = await rig.chat(body, {"x-fake-chunks": "3"})
    assert status == 200
    assert raw == b"".join(rig.fake.events(body, rig.fake.build_chunks(body, "text", 3)))


async def test_record_tokens_off_passes_bytes_through(make_rig):
    rig = await make_rig(**{"proxy.record_tokens": False})
    body = _body()
    _, _, raw = await rig.chat(body)
    assert "logprobs" not in rig.fake.received[-1].body
    assert raw == b"".join(rig.fake.events(body, rig.fake.build_chunks(body, "text", 4)))


async def test_non_stream_strips_added_fields_and_keeps_weight_version(rig):
    body = _body(stream=False)
    status, headers, raw = await rig.chat(body)
    assert status == 200
    obj = orjson.loads(raw)
    assert "prompt_token_ids" not in obj and "token_ids" not in obj["choices"][0]
    assert obj["choices"][0]["logprobs"] is None
    assert obj["weight_version"] == 7 and headers["x-weight-version"] == "7"
    assert obj["choices"][0]["message"]["content"].startswith("pong: hello")


async def test_gzip_upstream_is_decoded(rig):
    for stream in (True, False):
        status, headers, raw = await rig.chat(_body(stream=stream), {"x-fake-gzip": "1"})
        assert status == 200
        assert "Content-Encoding" not in headers
        assert b"pong: hello" in raw


async def test_models_and_other_paths(rig):
    async with rig.client.get(rig.url + "/v1/models") as r:
        assert r.status == 200
        data = await r.json()
        assert data["data"][0]["max_model_len"] == 8192
    async with rig.client.post(rig.url + "/v1/embeddings", json={"input": "x", "model": "m"}) as r:
        assert r.status == 200 and (await r.json())["data"][0]["embedding"] == [0.1, 0.2, 0.3]
    async with rig.client.put(rig.url + "/v1/echo/a%2Fb?q=1&r=%20", data=b"raw body",
                              headers={"Connection": "keep-alive, x-drop", "x-drop": "1",
                                       "x-keep": "2"}) as r:
        echo = await r.json()
        assert echo["method"] == "PUT" and echo["path"] == "/v1/echo/a%2Fb?q=1&r=%20"
        assert echo["body"] == "raw body"
        assert echo["headers"].get("x-keep") == "2" and "x-drop" not in echo["headers"]
    async with rig.client.get(rig.url + "/nope") as r:
        assert r.status == 404
        assert (await r.json())["error"]["code"] == "not_found"


async def test_stream_is_not_buffered(rig):
    import time

    t0 = time.perf_counter()
    arrivals = []
    async with rig.client.post(rig.url + "/v1/chat/completions", json=_body(),
                               headers={"x-fake-chunks": "5", "x-fake-delay-ms": "150"}) as r:
        while data := await r.content.readany():
            if b"pong" in data or b"part" in data:
                arrivals.append(time.perf_counter() - t0)
    # Each content chunk arrives on its own, ~150 ms apart, not all at the end.
    assert len(arrivals) >= 4, arrivals
    assert arrivals[0] < 0.3 and arrivals[-1] - arrivals[0] > 0.4, arrivals


async def test_concurrent_streams_recorded_separately(rig):
    import asyncio

    async def one(i: int):
        status, _, raw = await rig.chat(_body(f"user {i}"), {"session_id": f"c{i}:0", "x-fake-delay-ms": "5"})
        assert status == 200 and f"pong: user {i}".encode() in raw

    await asyncio.gather(*(one(i) for i in range(12)))
    await rig.wait_recorded(12)
    turns = rig.turns()
    assert sorted(t["session_id"] for t in turns) == sorted(f"c{i}" for i in range(12))
    for t in turns:
        assert t["response_text"] == f"pong: user {t['session_id'][1:]} part1 part2 part3"
        assert t["completion_token_ids"] == [100, 101, 102, 103]


def test_prompt_token_ids_alone_are_stripped():
    # A first chunk that carries only prompt_token_ids (no choice-level token_ids or logprobs key)
    # must not leak them to a client that did not ask.
    from clawproxy.proxy.sse import Added, StreamTap

    chunk = {"id": "c1", "object": "chat.completion.chunk", "prompt_token_ids": [1, 2, 3],
             "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    tap = StreamTap(Added(logprobs=True, token_ids=True))
    out = tap.feed(b"data: " + orjson.dumps(chunk) + b"\n\n")
    assert orjson.loads(event_data(out)) == {k: v for k, v in chunk.items() if k != "prompt_token_ids"}
    assert tap.turn().prompt_token_ids == [1, 2, 3]  # the recorder still gets the ids
