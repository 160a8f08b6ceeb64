"""/metrics: real traffic through the proxy rig and real store rows, scraped and parsed with
prometheus-client's own parser; the access rules of the other control endpoints."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from clawproxy.store import Store
from judge.voters import Vote
from judge.worker import Worker
from tests.trainer.util import insert_turn
from tests.waits import until

CHAT = "/v1/chat/completions"


def _body(text: str, stream: bool = True) -> dict[str, Any]:
    return {"model": "m", "stream": stream, "messages": [{"role": "user", "content": text}]}


async def _scrape(rig, headers: dict[str, str] | None = None) -> dict[tuple[str, frozenset], float]:
    """sample name + labels -> value."""
    async with rig.client.get(rig.url + "/metrics", headers=headers or {}) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _get(m: dict, name: str, **labels: str) -> float | None:
    return m.get((name, frozenset(labels.items())))


async def test_requests_by_route_and_status_and_their_latency(rig):
    paced = {"x-fake-chunks": "2", "x-fake-delay-ms": "200"}

    async def stream(i: int, headers: dict[str, str] | None = None) -> int:
        status, _, _ = await rig.chat(_body(f"hi {i}"), {"x-session-id": f"s{i}", **(headers or {})})
        return status

    assert await asyncio.gather(stream(0, paced), stream(1, paced), stream(2)) == [200, 200, 200]
    assert (await rig.chat(_body("plain", stream=False)))[0] == 200
    assert (await rig.chat(_body("boom"), {"x-fake-status": "500"}))[0] == 500
    async with rig.client.post(rig.url + CHAT, data=b"{", headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400  # never reached the upstream
    async with rig.client.get(rig.url + "/v1/models") as r:
        assert r.status == 200
    async with rig.client.get(rig.url + "/v1/load_lora_adapter") as r:
        assert r.status == 404
    await rig.wait_recorded(6)
    upstream_calls = len(rig.fake.received)

    m = await _scrape(rig)
    assert len(rig.fake.received) == upstream_calls  # /metrics is the proxy's own, never forwarded
    assert _get(m, "clawproxy_requests_total", route=CHAT, status="200") == 4
    assert _get(m, "clawproxy_requests_total", route=CHAT, status="500") == 1
    assert _get(m, "clawproxy_requests_total", route=CHAT, status="400") == 1
    assert _get(m, "clawproxy_requests_total", route="/v1/models", status="200") == 1
    assert _get(m, "clawproxy_requests_total", route="not_forwarded", status="404") == 1
    # latency is observed for the requests that reached the upstream: 5 chats, 1 models
    assert _get(m, "clawproxy_upstream_seconds_count", route=CHAT) == 5
    assert _get(m, "clawproxy_added_seconds_count", route=CHAT) == 5
    assert _get(m, "clawproxy_upstream_seconds_count", route="/v1/models") == 1
    # two streams waited 2 x 200 ms on the upstream: its time, not the proxy's
    assert _get(m, "clawproxy_upstream_seconds_sum", route=CHAT) >= 0.8
    assert _get(m, "clawproxy_upstream_seconds_bucket", route=CHAT, le="0.25") == 3
    assert _get(m, "clawproxy_added_seconds_bucket", route=CHAT, le="0.25") == 5
    assert _get(m, "clawproxy_added_seconds_sum", route=CHAT) < 0.5

    stats = await rig.stats()
    assert _get(m, "clawproxy_recorder_turns_recorded_total") == stats["turns_recorded"] == 6
    assert _get(m, "clawproxy_recorder_queue_depth") == 0
    assert _get(m, "clawproxy_recorder_spool_records") == 0
    assert _get(m, "clawproxy_recorder_quarantined") == 0
    assert _get(m, "clawproxy_recorder_turns_lost_total") == 0
    assert _get(m, "clawproxy_recorder_store_ok") == 1
    assert _get(m, "clawproxy_in_flight") == 0
    assert _get(m, "clawproxy_upstream_weight_version") == rig.fake.weight_version == 7
    assert _get(m, "clawproxy_store_readable") == 1

    async with rig.client.post(rig.url + CHAT, json=_body("again")) as r:
        await r.read()
    m2 = await _scrape(rig)
    assert _get(m2, "clawproxy_requests_total", route=CHAT, status="200") == 5


def _judged(store: Store, scores: list[int | None]) -> int:
    """A recorded turn judged by the real judge's write path with these votes."""
    tid = insert_turn(store, prompt_ids=[1, 2], completion_ids=[3, 4], score=None)
    assert Worker(store, voter=_Named("lexical")).write(tid, [Vote(s, error=None if s is not None else "x")
                                                              for s in scores]) is not None
    return tid


class _Named:
    def __init__(self, name: str):
        self.name = name


async def test_judge_trainer_and_engine_metrics_come_from_the_store(rig):
    await rig.chat(_body("creates the store"))
    await rig.wait_recorded(1)
    store = Store(rig.cfg.db_path)
    try:
        t1 = _judged(store, [1, 1, -1])       # judgment +1
        t2 = _judged(store, [-1, -1, None])   # -1
        t3 = _judged(store, [0, None, None])  # 0
        # a turn waiting for the judge: its next state came with a turn 30 s ago
        waiting = insert_turn(store, prompt_ids=[1], completion_ids=[2], score=None)
        nxt = insert_turn(store, prompt_ids=[1], completion_ids=[2], score=None)
        store.update("turns", "id", nxt, {"created_at": time.time() - 30})
        store.update("turns", "id", waiting, {"next_state": [{"role": "user", "content": "ok"}],
                                              "next_turn_id": nxt})
        store.record_skipped({t3: "score_0"})
        store.record_step(method="combined", base_version=0, new_version=1, status="published",
                          metrics={"loss": 0.5, "kl": 0.01, "reload_s": 0.7}, objectives={t1: "rl", t2: "rl"},
                          checkpoint={"path": "/x/v1", "format": "full", "gate": {}, "engine": True})
        store.record_step(method="combined", base_version=1, new_version=None, status="gate_failed",
                          metrics={"loss": 2.5, "kl": 0.3}, objectives={})
    finally:
        store.close()

    m = await _scrape(rig)
    assert _get(m, "clawproxy_judge_votes_total", voter="lexical", score="1") == 2
    assert _get(m, "clawproxy_judge_votes_total", voter="lexical", score="-1") == 3
    assert _get(m, "clawproxy_judge_votes_total", voter="lexical", score="0") == 1
    assert _get(m, "clawproxy_judge_votes_total", voter="lexical", score="failed") == 3
    assert [_get(m, "clawproxy_judge_judgments_total", score=s) for s in ("1", "0", "-1")] == [1, 1, 1]
    assert _get(m, "clawproxy_judge_pending_turns") == 1
    assert 30 <= _get(m, "clawproxy_judge_lag_seconds") < 60
    assert _get(m, "clawproxy_trainer_steps_total", status="published") == 1
    assert _get(m, "clawproxy_trainer_steps_total", status="gate_failed") == 1
    assert _get(m, "clawproxy_trainer_samples_trained_total") == 2
    assert _get(m, "clawproxy_trainer_samples_skipped_total", reason="score_0") == 1
    assert _get(m, "clawproxy_trainer_last_loss") == 2.5
    assert _get(m, "clawproxy_trainer_last_kl") == 0.3
    assert _get(m, "clawproxy_engine_reload_seconds_count") == 1
    assert _get(m, "clawproxy_engine_reload_seconds_sum") == 0.7
    assert _get(m, "clawproxy_engine_reload_seconds_bucket", le="0.5") == 0
    assert _get(m, "clawproxy_engine_reload_seconds_bucket", le="1.0") == 1
    assert _get(m, "clawproxy_weight_version") == 1
    assert time.time() - _get(m, "clawproxy_weight_version_published_timestamp_seconds") < 60


async def test_a_slow_store_read_never_holds_up_a_request(rig, monkeypatch):
    await rig.chat(_body("creates the store"))
    await rig.wait_recorded(1)
    slow = Store.vote_counts
    reading = threading.Event()

    def vote_counts(self: Store, after_id: int = 0) -> list[dict[str, Any]]:
        reading.set()
        time.sleep(1.0)  # a scrape stuck on a big store: the event loop must not wait for it
        return slow(self, after_id)

    monkeypatch.setattr(Store, "vote_counts", vote_counts)
    scrape = asyncio.create_task(_scrape(rig), name="scrape")
    await until(reading.is_set, "the scrape to be inside its slow store read")
    t0 = time.monotonic()
    status, _, _ = await rig.chat(_body("while scraping"))
    took = time.monotonic() - t0
    assert status == 200 and not scrape.done() and took < 0.5, took
    await scrape


async def test_store_read_at_most_once_per_interval_and_votes_counted_across_deletions(rig, monkeypatch):
    from clawproxy.proxy import metrics

    await rig.chat(_body("creates the store"))
    await rig.wait_recorded(1)
    reads = []
    counts = Store.judgment_counts
    monkeypatch.setattr(Store, "judgment_counts", lambda self: reads.append(1) or counts(self))
    store = Store(rig.cfg.db_path)
    try:
        _judged(store, [1, 1, 1])
        ms = await asyncio.gather(*(_scrape(rig) for _ in range(4)))  # four tabs polling at once
        assert reads == [1] and all(_get(m, "clawproxy_judge_votes_total", voter="lexical", score="1") == 3
                                    for m in ms)
        monkeypatch.setattr(metrics, "STORE_READ_INTERVAL_S", 0.0)
        sid = "gone"
        store.insert("sessions", {"id": sid, "source": "header", "first_seen": 0, "last_seen": 0})
        store.update("turns", "id", _judged(store, [-1, -1, 0]), {"session_id": sid})
        m = await _scrape(rig)
        assert _get(m, "clawproxy_judge_votes_total", voter="lexical", score="-1") == 2
        store.delete_session(sid)  # its votes go with it: counted again, not carried over
        _judged(store, [0, 0, 0])
        m = await _scrape(rig)
        assert len(reads) == 3
    finally:
        store.close()
    assert _get(m, "clawproxy_judge_votes_total", voter="lexical", score="-1") is None
    assert _get(m, "clawproxy_judge_votes_total", voter="lexical", score="0") == 3
    assert _get(m, "clawproxy_judge_votes_total", voter="lexical", score="1") == 3


async def test_metrics_has_the_control_endpoints_access_rules(make_rig):
    off = await make_rig(**{"proxy.host": "0.0.0.0", "proxy.control_token": "t0k"})
    async with off.client.get(off.url + "/metrics") as r:
        assert r.status == 401 and (await r.json())["error"]["type"] == "authentication_error"
    async with off.client.get(off.url + "/metrics", headers={"Authorization": "Bearer wrong"}) as r:
        assert r.status == 401
    m = await _scrape(off, {"Authorization": "Bearer t0k"})
    assert _get(m, "clawproxy_requests_total", route="not_forwarded", status="404") is None
    assert off.fake.received == []
