"""Recording: what lands in the store for streamed and non-streamed turns."""

from __future__ import annotations

from tests.proxy.test_proxy_forwarding import CTX_MSG, _body


async def test_stream_turn_recorded_with_tokens(rig):
    headers = {"Authorization": "Bearer sk-very-secret", "session_id": "s1:0", "x-fake-chunks": "3"}
    status, _, _ = await rig.chat(_body("hi there"), headers)
    assert status == 200
    await rig.wait_recorded(1)
    [t] = rig.turns()
    assert t["session_id"] == "s1" and t["compaction"] == 0
    assert t["status"] == "ok" and t["http_status"] == 200 and t["stream"] == 1
    assert t["kind"] == "main" and t["reason"] == "pending" and t["trainable"] == 0
    assert t["response_text"] == "pong: hi there part1 part2"
    assert t["finish_reason"] == "stop"
    assert t["completion_token_ids"] == [100, 101, 102]
    assert t["completion_logprobs"] == [-0.25, -0.25, -0.25]
    assert t["prompt_token_ids"] == [1, 2, 3, 3]
    assert t["weight_version"] == 7 and t["weight_versions"] == [7]
    assert t["usage"]["total_tokens"] == 15
    assert t["request_messages"][-1] == CTX_MSG  # exactly as sent, transient context included
    assert "logprobs" not in t["request_params"]  # the client's params, not ours
    assert t["ttft_ms"] > 0 and t["total_ms"] >= t["ttft_ms"]
    # Credentials are forwarded, never stored.
    for p in rig.cfg.data_path.iterdir():
        assert b"sk-very-secret" not in p.read_bytes(), p


async def test_tool_calls_and_reasoning_reassembled(rig):
    await rig.chat(_body("read it"), {"x-session-id": "s2", "x-fake-mode": "tool"})
    await rig.chat(_body("think"), {"x-session-id": "s3", "x-fake-mode": "reasoning"})
    await rig.wait_recorded(2)
    tool, reason = rig.turns()
    assert tool["response_tool_calls"] == [{"id": "call_fake1", "type": "function", "function": {
        "name": "read", "arguments": '{"path": "hello.txt"}'}}]
    assert tool["finish_reason"] == "tool_calls" and tool["response_text"] is None
    assert reason["response_reasoning"] == "Let me think. Done thinking."
    assert reason["response_text"].startswith("pong: think")


async def test_non_stream_turn_recorded(rig):
    await rig.chat(_body("plain", stream=False), {"x-session-id": "s4", "x-fake-mode": "tool"})
    await rig.wait_recorded(1)
    [t] = rig.turns()
    assert t["stream"] == 0 and t["status"] == "ok"
    assert t["response_tool_calls"][0]["function"]["name"] == "read"
    assert t["completion_token_ids"] == [100, 101, 102]
    assert t["prompt_token_ids"] == [1, 2, 3] and t["weight_version"] == 7


async def test_weight_version_falls_back_to_header_then_store(rig):
    rig.fake.weight_version = None
    await rig.chat(_body("no version"), {"x-session-id": "s5"})
    await rig.wait_recorded(1)
    [t] = rig.turns()
    assert t["weight_version"] == 0  # no checkpoint published yet


async def test_truncated_and_degenerate_not_trainable(rig):
    await rig.chat(_body("a"), {"x-session-id": "t1", "x-fake-mode": "length"})
    await rig.chat(_body("b"), {"x-session-id": "t2", "x-fake-mode": "degenerate"})
    await rig.wait_recorded(2)
    a, b = rig.turns()
    assert (a["reason"], a["trainable"]) == ("truncated", 0)
    assert (b["reason"], b["trainable"]) == ("degenerate", 0)
    # Once the user reacts, a cut-off answer is judged like any other (the trainer decides what to
    # do with it: only ever a negative); a degenerate one never is.
    for t, sid in ((a, "t1"), (b, "t2")):
        follow = _body("too long, keep it short")
        follow["messages"][1:1] = [{"role": "user", "content": t["request_messages"][1]["content"]},
                                   {"role": "assistant", "content": t["response_text"]}]
        await rig.chat(follow, {"x-session-id": sid})
    await rig.wait_recorded(4)
    a, b = rig.turns()[:2]
    # truncated -> ok (clawproxy/store/lifecycle.py); the cut-off stays in its finish_reason
    assert (a["reason"], a["trainable"], a["next_state_role"], a["finish_reason"]) == ("ok", 1, "user", "length")
    assert (b["reason"], b["trainable"]) == ("degenerate", 0) and b["next_state"] is not None


async def test_upstream_without_token_fields_still_works(rig):
    # An upstream that rejects vLLM's extras: the proxy retries without them and stops adding them.
    for i in range(2):
        status, _, raw = await rig.chat(_body(f"plain {i}"), {"x-session-id": "nv", "x-fake-reject-tokens": "1"})
        assert status == 200 and f"pong: plain {i}".encode() in raw
    assert [("logprobs" in r.body) for r in rig.fake.received] == [True, False, False]
    await rig.wait_recorded(2)
    a, b = rig.turns()
    assert a["status"] == "ok" and a["completion_token_ids"] is None and a["trainable"] == 0
    assert (await rig.stats())["requests"] == 2
    # The client's own 400s are not mistaken for that.
    status, _, _ = await rig.chat(_body("x", logprobs=True), {"x-fake-status": "400"})
    assert status == 400


async def test_client_error_about_logprobs_does_not_stop_token_recording(rig):
    # The upstream refuses a field the client itself sent (here: logprobs). Retrying without our
    # fields fails the same way, so they were not the problem: keep asking for token ids.
    status, _, _ = await rig.chat(_body("own", logprobs=True), {"x-session-id": "lp",
                                                                "x-fake-reject-tokens": "1"})
    assert status == 400
    status, _, _ = await rig.chat(_body("next"), {"x-session-id": "lp2"})
    assert status == 200
    assert rig.fake.received[-1].body.get("return_token_ids") is True
    await rig.wait_recorded(2)
    assert rig.turns()[-1]["completion_token_ids"]


def test_turn_version_is_that_of_its_tokens():
    """A request that waited through a pause-keep reload opens under the old version (its role
    chunk) and is generated by the new one: the recorded version is the tokens'."""
    import orjson

    from clawproxy.proxy.sse import StreamTap

    def assemble_events(chunks):
        tap = StreamTap()
        for c in chunks:
            tap.feed(b"data: " + orjson.dumps(c) + b"\n\n")
        return tap.turn()

    def tok(i, v, finish=None):
        return {"choices": [{"index": 0, "delta": {"content": f"t{i}"}, "token_ids": [i],
                             "finish_reason": finish}], "weight_version": v}

    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "weight_version": 3}
    usage = {"choices": [], "usage": {"completion_tokens": 2}, "weight_version": 4}
    out = assemble_events([role, tok(1, 4), tok(2, 4, "stop"), usage])
    assert out.weight_versions == [4] and out.completion_token_ids == [1, 2]
    # paused mid-stream: both versions, in order
    assert assemble_events([role, tok(1, 3), tok(2, 4, "stop")]).weight_versions == [3, 4]
    # only the envelope carries a version: it is all there is
    assert assemble_events([role, {"choices": [{"index": 0, "delta": {"content": "x"}}]}]).weight_versions == [3]


async def test_ttft_is_the_first_generated_token_not_the_role_chunk(rig):
    # the role-only first chunk comes at once; the first text after one 300 ms pause
    await rig.chat(_body("slow"), {"x-session-id": "ttft", "x-fake-delay-ms": "300", "x-fake-chunks": "2"})
    await rig.wait_recorded(1)
    (t,) = rig.turns()
    assert 300 <= t["ttft_ms"] < t["total_ms"], t
