"""Sessions: identity, side/retry classification and next-state linking, on real OpenClaw traffic."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import orjson
import pytest

from clawproxy.degenerate import is_degenerate
from clawproxy.proxy.sessions import (
    classify,
    identify,
    next_state_after,
    prefix_hashes,
    split_compaction,
    strip_ctx,
)
from clawproxy.store.lifecycle import LEARN_HEADER
from tests.proxy.test_proxy_forwarding import CTX_MSG
from tests.waits import until

# A copy of shared/openclaw/samples.jsonl (real OpenClaw requests; keys are fake test keys).
SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "openclaw_samples.jsonl"


@pytest.fixture(scope="module")
def samples() -> list[dict]:
    return [orjson.loads(line) for line in SAMPLES.read_bytes().splitlines() if line.strip()]


def _replay_headers(h: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in h.items() if k.lower() not in ("host", "content-length", "connection")}


def test_split_compaction():
    assert split_compaction("deb7:0") == ("deb7", 0)
    assert split_compaction("deb7") == ("deb7", None)
    assert split_compaction("a:b:12") == ("a:b", 12)
    assert split_compaction("agent:main") == ("agent:main", None)


def test_identity_order():
    body = {"prompt_cache_key": "pck:2", "messages": [
        {"role": "user", "content": "hi\n\nRuntime: agent=main | session=agent:main:x | sessionId=rt | host=h"}]}
    assert identify({"session_id": "hdr:1"}, body).session_id == "hdr"
    assert identify({"x-session-affinity": "aff:3"}, body).compaction == 3
    i = identify({"x-session-id": "xs"}, body)
    assert (i.session_id, i.source, i.compaction) == ("pck", "prompt_cache_key", 2)
    assert identify({"x-session-id": "xs"}, {"messages": body["messages"]}).session_id == "xs"
    i = identify({}, {"messages": body["messages"]})
    assert (i.session_id, i.source, i.session_key, i.agent) == ("rt", "runtime", "agent:main:x", "main")
    assert identify({}, {"messages": [{"role": "user", "content": "plain"}]}).session_id is None


def test_classify_samples(samples):
    kinds = {s["label"].split(" ")[0]: classify(s["body"], True)
             for s in samples if isinstance(s.get("body"), dict) and "messages" in s["body"]}
    assert kinds["compaction-summary"] == "compaction"
    assert kinds["heartbeat-turn"] == "heartbeat"
    for label in ("main-turn-1", "main-turn-2", "tool-followup", "reasoning"):
        assert kinds[label] is None, label
    assert classify({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}, False) == "probe"
    assert classify({"messages": [{"role": "system", "content": "Generate a concise session title (3-6 words"},
                                  {"role": "user", "content": "x"}]}, True) == "title"
    assert classify({"messages": [{"role": "system", "content": "You are a memory search agent. Another"},
                                  {"role": "user", "content": "x"}]}, True) == "recall"
    assert classify({"messages": [{"role": "system", "content": "a\nPre-compaction memory flush turn. b"},
                                  {"role": "user", "content": "Pre-compaction memory flush. go"}]}, True) == "memory_flush"


def test_next_state_tolerates_rerendering():
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "read hello.txt"}, CTX_MSG]
    p = strip_ctx(prompt)
    # OpenClaw replays the call with a sanitized id, re-serialized args, and drops the CTX message.
    nxt = [*p, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "callfake1", "type": "function", "function": {"name": "read", "arguments": '{"path":"hello.txt"}'}}]},
        {"role": "tool", "content": "HELLO", "tool_call_id": "callfake1"}, CTX_MSG]
    assert next_state_after(nxt, len(p), prefix_hashes(p)[-1]) == [nxt[3]]
    # <think> stripped and whitespace changes in history still match the prefix.
    p2 = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>hm</think>a  b"},
          {"role": "user", "content": "again"}]
    replay = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a b"},
              {"role": "user", "content": "again"}, {"role": "assistant", "content": "x"},
              {"role": "user", "content": "thanks"}, CTX_MSG]
    assert prefix_hashes(p2)[-1] == prefix_hashes(replay[:3])[-1]
    assert next_state_after(replay, 3, prefix_hashes(p2)[-1]) == [{"role": "user", "content": "thanks"}]
    # History rewritten (compaction): fall back to what follows the last assistant message.
    assert next_state_after(replay, 3, b"other") == [{"role": "user", "content": "thanks"}]
    assert next_state_after([{"role": "user", "content": "x"}, CTX_MSG], 3, b"") is None
    # A heartbeat exchange between the turn and the user's reply is not the user's reaction.
    hb = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
          {"role": "user", "content": "Follow the heartbeat monitor scratch context when provided."},
          {"role": "assistant", "content": "NO_REPLY"}, {"role": "user", "content": "thanks"}, CTX_MSG]
    assert next_state_after(hb, 1, prefix_hashes(hb[:1])[-1]) == [{"role": "user", "content": "thanks"}]


def test_degenerate():
    assert is_degenerate("the same words again " * 30)
    assert is_degenerate("ha" * 300)
    assert not is_degenerate("A normal answer that explains how the proxy records turns and why "
                             "next states matter for training, with enough distinct words to count.")
    assert not is_degenerate("zeros = [0, 0, 0, 0, 0, 0, 0, 0]  # a buffer of eight")  # data, not a loop
    # long real texts (prose, code, tables) are not loops
    for path in ("README.md", "clawproxy/store/turns.py", "docs/openclaw-wire.md"):
        assert not is_degenerate((Path(__file__).resolve().parents[2] / path).read_text()), path


async def test_replay_samples_through_proxy(rig, samples):
    by_label: dict[str, dict] = {}
    for s in samples:
        by_label.setdefault(s["label"].split(" ")[0], s)

    async def send(sample: dict, mode: str = "text", body: dict | None = None) -> int:
        h = _replay_headers(sample["headers"]) | {"x-fake-mode": mode}
        async with rig.client.request(sample["method"], rig.url + sample["path"], headers=h,
                                      data=orjson.dumps(body or sample["body"]) if (body or sample["body"]) else None
                                      ) as r:
            raw = await r.read()
            assert r.status == (404 if sample["path"] == "/v1/responses" else 200), raw[:300]
            return r.status

    def first_call(sample: dict) -> dict:
        # The samples hold the tool follow-up; its first call is the same minus the tool exchange.
        b = copy.deepcopy(sample["body"])
        b["messages"] = b["messages"][:2] + [b["messages"][-1]]
        return b

    await send(by_label["main-turn-1"])
    await send(by_label["main-turn-2"])
    await send(by_label["tool-followup"], "tool", first_call(by_label["tool-followup"]))
    await send(by_label["tool-followup"])
    await send(by_label["compaction-summary"])
    await send(by_label["heartbeat-turn"])
    aff = next(s for s in samples if s["label"].startswith("main-turn with compat"))
    await send(aff, "tool", first_call(aff))
    await send(aff)
    await send(next(s for s in samples if s["label"].startswith("compaction-summary with affinity")))
    await send(next(s for s in samples if s["label"].startswith("main-turn after compaction")))
    await send(by_label["openai-responses"])
    await send(by_label["model"])
    await send(by_label["reasoning"])
    await rig.wait_recorded(11)
    t = rig.turns()
    assert len(t) == 11  # every chat completion, none of the other endpoints

    s_main, s_tool, s_aff = ("590ac9c6-6525-41ad-af60-fc0b6dcbfc35", "6077b3a3-10d7-4474-a6e7-c003a00419df",
                             "deb7e40f-e9d7-4a48-93df-92561cf07378")
    assert [x["session_id"] for x in t] == [s_main, s_main, s_tool, s_tool, None, s_main, s_aff, s_aff,
                                            s_aff, s_aff, "fb142d93-cb56-492d-a132-68f74ac19dd2"]
    assert [x["kind"] for x in t] == ["main", "main", "main", "main", "side", "side", "main", "main",
                                      "side", "main", "main"]
    assert t[4]["side_kind"] == "compaction" and t[5]["side_kind"] == "heartbeat"
    assert t[8]["side_kind"] == "compaction" and t[8]["compaction"] is None
    assert [t[6]["compaction"], t[9]["compaction"]] == [0, 1]
    # main-turn-1 -> the user's second message.
    assert t[0]["next_state_role"] == "user" and t[0]["trainable"] == 1 and t[0]["reason"] == "ok"
    assert t[0]["next_state"][0]["content"].endswith("second turn please")
    assert t[0]["next_turn_id"] == t[1]["id"]
    # Tool calls -> their tool results, in both the runtime-line and the affinity-header sessions.
    for call in (t[2], t[6]):
        assert call["next_state_role"] == "tool" and call["trainable"] == 1, call
        assert call["next_state"][0]["content"] == "HELLO FROM FILE 42\n"
    # After compaction the rewritten history still yields the next state of the tool follow-up.
    assert t[7]["next_state"][0]["content"].endswith("after compaction")
    # Side turns are never trainable; session rows exist with their sources.
    assert all(x["trainable"] == 0 and x["reason"] == "side" for x in (t[4], t[5], t[8]))
    st = rig.store()
    try:
        srcs = {r["id"]: r["source"] for r in st.query("SELECT id, source FROM sessions")}
    finally:
        st.close()
    assert srcs[s_main] == "runtime" and srcs[s_aff] == "header"


async def test_recorded_sample_stream_passes_byte_identical(rig, samples):
    raw = next(s for s in samples if s["label"].startswith("sse-response-tool-call"))["raw_sse"].encode()
    rig.fake.raw_sse = raw
    body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "read"}]}
    status, _, got = await rig.chat(body, {"x-session-id": "raw"})
    assert status == 200 and got == raw
    await rig.wait_recorded(1)
    [t] = rig.turns()
    assert t["response_tool_calls"][0]["function"] == {"name": "read", "arguments": '{"path": "hello.txt"}'}
    assert t["usage"]["total_tokens"] == 18


async def test_prefix_chaining_without_identity(rig):
    m1 = [{"role": "system", "content": "s"}, {"role": "user", "content": "first"}, CTX_MSG]
    await rig.chat({"model": "m", "stream": True, "messages": m1})
    await rig.wait_recorded(1)
    m2 = [*m1[:2], {"role": "assistant", "content": "pong: first part1"},
          {"role": "user", "content": "no, wrong"}, CTX_MSG]
    await rig.chat({"model": "m", "stream": True, "messages": m2})
    await rig.wait_recorded(2)
    a, b = rig.turns()
    assert a["session_id"].startswith("anon-") and b["session_id"] == a["session_id"]
    assert a["next_state"] == [{"role": "user", "content": "no, wrong"}] and a["trainable"] == 1


async def test_a_conversation_the_client_keeps_out_of_learning(rig):
    """``x-clawproxy-learn: off`` (an OpenClaw provider's headers): recorded (the next state too,
    for the record), never in ``ok``, so neither judged nor trained; the same words without it are."""
    m1 = [{"role": "system", "content": "s"}, {"role": "user", "content": "first"}, CTX_MSG]
    m2 = [*m1[:2], {"role": "assistant", "content": "pong: first part1"},
          {"role": "user", "content": "no, wrong"}, CTX_MSG]
    for sid, learn in (("kept-out", "Off"), ("learned", None)):
        headers = {"x-session-id": sid, **({LEARN_HEADER: learn} if learn else {})}
        await rig.chat({"model": "m", "stream": True, "messages": m1}, headers)
        await rig.chat({"model": "m", "stream": True, "messages": m2}, headers)
    await rig.wait_recorded(4)
    out1, out2, in1, in2 = rig.turns()
    assert [(t["reason"], t["trainable"]) for t in (out1, out2)] == [("not_learned", 0)] * 2
    assert out1["next_state"] == [{"role": "user", "content": "no, wrong"}]
    assert (in1["reason"], in1["trainable"], in1["next_state"]) == ("ok", 1, [{"role": "user", "content": "no, wrong"}])
    assert in2["reason"] == "pending"


async def test_restart_keeps_chaining_and_retry_memory(make_rig):
    """A restarted proxy links the next request of an open anonymous conversation to its last
    answer, and a retry sent across the restart is still one turn."""
    rig = await make_rig()
    m1 = [{"role": "system", "content": "s"}, {"role": "user", "content": "first"}, CTX_MSG]
    await rig.chat({"model": "m", "stream": True, "messages": m1})
    other = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "[Sun 2026-11-29 23:01 UTC] q"}]}
    await rig.chat(other, {"x-session-id": "r2"})
    await rig.wait_recorded(2)
    await rig.app.shutdown()
    await rig.app.cleanup()

    rig2 = await make_rig()  # same data dir, fresh memory
    m2 = [*m1[:2], {"role": "assistant", "content": "pong: first part1"},
          {"role": "user", "content": "no, wrong"}, CTX_MSG]
    await rig2.chat({"model": "m", "stream": True, "messages": m2})
    retry = {**other, "messages": [{"role": "user", "content": "[Sun 2026-11-29 23:02 UTC] q"}]}
    await rig2.chat(retry, {"x-session-id": "r2"})
    await rig2.wait_recorded(2)
    a, first_q, b, dup = rig2.turns()
    assert a["session_id"].startswith("anon-") and b["session_id"] == a["session_id"]
    assert a["next_state"] == [{"role": "user", "content": "no, wrong"}] and a["trainable"] == 1
    assert (first_q["kind"], dup["kind"], dup["reason"]) == ("main", "retry", "retry")


async def test_retry_keeps_one(rig):
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "[Sun 2026-11-29 23:01 UTC] q"}]}
    await rig.chat(body, {"x-session-id": "r1", "x-fake-status": "500"})
    retry = {**body, "messages": [{"role": "user", "content": "[Sun 2026-11-29 23:02 UTC] q"}]}
    await rig.chat(retry, {"x-session-id": "r1"})
    await rig.chat(retry, {"x-session-id": "r1"})
    await rig.wait_recorded(3)
    await rig.chat(retry, {"x-session-id": "other-user"})  # same body, another session: not a retry
    await rig.wait_recorded(4)
    failed, kept, dup, other = rig.turns()
    assert (failed["kind"], failed["status"], failed["http_status"]) == ("retry", "error", 500)
    assert (kept["kind"], kept["status"], kept["reason"]) == ("main", "ok", "pending")
    assert (dup["kind"], dup["reason"]) == ("retry", "retry")
    assert (other["kind"], other["session_id"]) == ("main", "other-user")


async def test_idle_sessions_finalized(make_rig):
    rig = await make_rig(**{"sessions.idle_timeout_s": 0.5})
    rig.app  # noqa: B018
    await rig.chat({"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]},
                   {"x-session-id": "idle"})
    await rig.wait_recorded(1)

    def finalized() -> list[dict] | None:
        turns = rig.turns()
        return turns if turns[0]["reason"] == "no_next_state" else None

    [t] = await until(finalized, "the idle session to be finalized", 5, poll=0.1)  # each check opens the store
    assert t["reason"] == "no_next_state" and t["trainable"] == 0
    st = rig.store()
    try:
        assert st.query_one("SELECT finalized_at FROM sessions WHERE id='idle'")["finalized_at"]
    finally:
        st.close()


async def test_retry_without_identity_joins_the_same_session(rig):
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "anonymous q"}]}
    await rig.chat(body, {"x-fake-status": "429"})
    await rig.chat(body)
    await rig.wait_recorded(2)
    failed, kept = rig.turns()
    assert failed["session_id"].startswith("anon-") and kept["session_id"] == failed["session_id"]
    assert (failed["kind"], kept["kind"], kept["reason"]) == ("retry", "main", "pending")


async def test_heartbeats_do_not_keep_a_session_from_finalizing(make_rig):
    # OpenClaw's heartbeat runs in the main session; it is not the user coming back.
    import asyncio

    rig = await make_rig(**{"sessions.idle_timeout_s": 0.6})
    h = {"x-session-id": "hb"}
    await rig.chat({"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}, h)
    hb = {"model": "m", "stream": True, "messages": [
        {"role": "user", "content": "Follow the heartbeat monitor scratch context when provided."}]}

    async def heartbeats() -> None:  # the fake client: several heartbeats within each idle timeout
        while True:
            await rig.chat(hb, h)
            await asyncio.sleep(0.15)

    beating = asyncio.create_task(heartbeats(), name="heartbeats")
    try:  # each check opens the store
        await until(lambda: [t["reason"] for t in rig.turns() if t["kind"] == "main"] == ["no_next_state"],
                    "the session to finalize while heartbeats keep coming", poll=0.1)
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
    main = [t for t in rig.turns() if t["kind"] == "main"]
    assert [t["reason"] for t in main] == ["no_next_state"]
