"""Learning by trying, the proxy's half: an unhappy user's next answer is served under a candidate
instruction that only the upstream sees, an active preference under its instruction; the turn says
which. Never on learn-off traffic, side requests, answers to a tool, or a user who turned it off."""

from __future__ import annotations

import asyncio
import random

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from clawproxy.config import Config
from clawproxy.instruct import HINT_TEMPLATE
from clawproxy.proxy.app import POLLER_KEY
from clawproxy.proxy.trying import Served, Trying, UserPlan, eligible
from clawproxy.proxy.wire import Outgoing
from clawproxy.store import Store

ASK = {"model": "m", "messages": [{"role": "system", "content": "You are helpful."},
                                  {"role": "user", "content": "How do I boil an egg?"}]}


def _cand(i: int, good: int = 0, bad: int = 0, prior: float = 0.5, text: str | None = None) -> dict:
    return {"id": i, "text": text or f"Instruction {i}.", "status": "candidate", "prior": prior,
            "good": good, "bad": bad, "tries": good + bad, "absorbed": 0}


def _prepare(t: Trying, obj: dict, body: bytes, headers: dict, user: str | None) -> tuple[bytes, Served | None]:
    """The trying addon's rewrite alone: the body that would go upstream, and what it was served under."""
    req = Outgoing("POST", "/v1/chat/completions", CIMultiDictProxy(CIMultiDict(headers)), body, obj, user, False)
    t.rewrite(req)
    return req.payload(), req.served


def _trying(**trying) -> Trying:
    cfg = Config()
    for k, v in trying.items():
        setattr(cfg.trying, k, v)
    return Trying(cfg, rng=random.Random(0))


def test_an_unhappy_user_is_tried_and_the_instruction_goes_after_their_last_message():
    t = _trying()
    t.plans = {None: UserPlan(candidates=[_cand(1)], unhappy=True)}
    body, served = _prepare(t, ASK, b"{}", {}, None)
    assert served is not None and served.role == "try" and served.tried == 1 and served.applied == ()
    import orjson

    sent = orjson.loads(body)
    assert sent["messages"][0] == ASK["messages"][0]  # the system prompt, and so the prefix cache, unchanged
    assert sent["messages"][1]["content"] == ("How do I boil an egg?\n\n"
                                              + HINT_TEMPLATE.format(hint="Instruction 1."))
    assert ASK["messages"][1]["content"] == "How do I boil an egg?"  # the client's body is not touched


def test_a_happy_user_gets_their_active_preference_and_no_try():
    t = _trying()
    active = {**_cand(5, text="Use bullet points"), "status": "active"}
    t.plans = {"ann": UserPlan(active=[active], candidates=[_cand(1)], unhappy=False)}
    _, served = _prepare(t, ASK, b"{}", {}, "ann")
    assert served is not None and (served.role, served.tried, served.applied) == ("apply", None, (5,))
    assert served.text == "Use bullet points."
    t.plans["ann"].unhappy = True
    _, served = _prepare(t, ASK, b"{}", {}, "ann")
    assert served is not None and served.role == "try" and served.text == "Use bullet points. Instruction 1."


@pytest.mark.parametrize("apply,absorbed,in_prompt", [
    ("prompt", 1, True), ("both", 0, True), ("both", 1, False), ("weights", 0, False)])
def test_where_an_active_preference_acts(apply, absorbed, in_prompt):
    t = _trying(apply=apply)
    t.plans = {None: UserPlan(active=[{**_cand(5), "status": "active", "absorbed": absorbed}])}
    _, served = _prepare(t, ASK, b"{}", {}, None)
    assert (served is not None) == in_prompt


def test_nothing_is_tried_without_a_plan_when_off_or_past_the_budget():
    t = _trying()
    assert _prepare(t, ASK, b"{}", {}, "nobody") == (b"{}", None)
    t.plans = {None: UserPlan(candidates=[_cand(1)], unhappy=True, off=True)}
    assert _prepare(t, ASK, b"{}", {}, None)[1] is None
    t.plans = {None: UserPlan(candidates=[_cand(1)], unhappy=True, turns=100, tried=34)}
    assert _prepare(t, ASK, b"{}", {}, None)[1] is None  # 35 of 101 would pass max_share 0.34
    t.plans = {None: UserPlan(candidates=[_cand(1)], unhappy=True, turns=3, tried=12)}
    assert _prepare(t, ASK, b"{}", {}, None)[1] is None  # the early budget: 0.34 of 36 turns
    t.plans = {None: UserPlan(candidates=[_cand(1)], unhappy=True, turns=3, tried=11)}
    assert _prepare(t, ASK, b"{}", {}, None)[1] is not None
    t = _trying(enabled=False)
    t.plans = {None: UserPlan(candidates=[_cand(1)], unhappy=True)}
    assert _prepare(t, ASK, b"{}", {}, None)[1] is None


def test_never_on_learn_off_side_requests_or_a_tools_result():
    assert eligible(ASK, {})
    assert not eligible(ASK, {"x-clawproxy-learn": "off"})
    heartbeat = {"messages": [{"role": "system", "content": "x"},
                              {"role": "user", "content": "[OpenClaw heartbeat poll] check in"}]}
    assert not eligible(heartbeat, {})
    tool = {"messages": [*ASK["messages"], {"role": "assistant", "content": "", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "file text"}]}
    assert not eligible(tool, {})
    assert not eligible({"messages": []}, {})


def test_thompson_sampling_prefers_the_candidate_with_good_replies():
    t = _trying()
    cands = [_cand(1, good=0, bad=3), _cand(2, good=4, bad=0), _cand(3, good=0, bad=0)]
    t.pulled.add(3)  # served once, its reply not judged yet
    picks = [t.pick(cands)["id"] for _ in range(200)]
    assert picks.count(2) > 2 * picks.count(3) and picks.count(1) < 10  # P(Beta(6,1) > Beta(2,1)) = 0.75
    # untried, each is served once first, nearest to the complaints first (sequential halving)
    t = _trying()
    fresh = [_cand(1, prior=0.3), _cand(2, prior=0.9), _cand(3, prior=0.5)]
    order = []
    for _ in range(3):
        order.append(t.pick(fresh)["id"])
        t.pulled.add(order[-1])
    assert order == [2, 3, 1]
    # then, still without evidence, the nearest leads, but every candidate is tried
    picks = [t.pick(fresh)["id"] for _ in range(300)]
    assert picks.count(2) > picks.count(1) and min(picks.count(i) for i in (1, 2, 3)) > 20


async def test_through_the_proxy_the_upstream_sees_the_instruction_and_the_turn_records_it(rig):
    store = Store(rig.cfg.db_path)
    pid = store.add_preference(None, "Answer in one sentence", "manual", status="active")
    store.close()
    await asyncio.to_thread(rig.app[POLLER_KEY].once)  # the poll would, within a second
    status, _, body = await rig.chat({**ASK, "max_tokens": 4})
    assert status == 200, body
    sent = [r.body for r in rig.fake.received if r.path == "/v1/chat/completions"][-1]
    assert sent["messages"][-1]["content"].endswith(HINT_TEMPLATE.format(hint="Answer in one sentence."))
    status, _, _ = await rig.chat({**ASK, "max_tokens": 4}, {"x-clawproxy-learn": "off"})
    assert status == 200
    sent = [r.body for r in rig.fake.received if r.path == "/v1/chat/completions"][-1]
    assert sent["messages"][-1]["content"] == "How do I boil an egg?"
    await rig.wait_recorded(2)
    turns = rig.turns()
    assert [(t["instruction"], t["instruction_role"], t["applied_ids"], t["instruction_id"]) for t in turns] == [
        ("Answer in one sentence.", "apply", [pid], None), (None, None, None, None)]
    # what was recorded is what the client sent: its history, not ours
    assert turns[0]["request_messages"][-1]["content"] == "How do I boil an egg?"


def test_the_poll_tries_until_a_preference_is_found_then_only_after_a_complaint(tmp_path):
    from tests.trainer.util import insert_turn

    cfg = Config(data_dir=str(tmp_path))
    store = Store(cfg.db_path)
    t = Trying(cfg)
    try:
        t.read(store)
        assert t.plans == {}  # nobody complained: nothing to try
        store.add_preference(None, "Be brief.", "bank", shortlisted=True)
        t.read(store)
        assert t.plans[None].unhappy and _prepare(t, ASK, b"{}", {}, None)[1] is not None
        store.add_preference(None, "Use bullet points.", "manual", status="active")
        turn = insert_turn(store, prompt_ids=[1], completion_ids=[2], score=1)
        t.read(store)
        assert not t.plans[None].unhappy and _prepare(t, ASK, b"{}", {}, None)[1].role == "apply"
        store.execute("UPDATE judgments SET score = 0, majority = -1 WHERE turn_id = ?", (turn,))
        t.read(store)  # the judge abstained, but its majority complained
        assert t.plans[None].unhappy and _prepare(t, ASK, b"{}", {}, None)[1].role == "try"
    finally:
        store.close()


def test_a_try_never_answered_is_given_back_to_the_budget(tmp_path):
    from tests.trainer.util import insert_turn

    store = Store(Config(data_dir=str(tmp_path)).db_path)
    try:
        def tried(score):
            turn = insert_turn(store, prompt_ids=[1], completion_ids=[2], score=score)
            store.update("turns", "id", turn, {"instruction": "x", "instruction_role": "try"})

        tried(1)
        tried(None)  # waiting for its reply: counted
        assert store.trying_counts(None) == {"turns": 2, "tried": 2, "counted": 2}
        insert_turn(store, prompt_ids=[1], completion_ids=[2], score=-1)  # a later turn was judged: never answered
        tried(None)
        assert store.trying_counts(None) == {"turns": 4, "tried": 3, "counted": 2}
    finally:
        store.close()
