"""Every way a chat request ends hands its capture to the recorder once, with the first outcome."""

from __future__ import annotations

import base64
import time

import aiohttp
import pytest

from clawproxy.proxy import wire
from clawproxy.proxy.app import RECORDER_KEY, STATS_KEY
from clawproxy.proxy.tap import Capture
from tests.waits import assert_stays, until

BODY = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
QUIET = 0.6  # QUIET_WAIT_S in the quiet-moment test: the store waits at most this long for one


def test_finish_is_idempotent():
    cap = Capture("r1", time.time(), "/v1/chat/completions", time.perf_counter())
    assert cap.finish("aborted", error="client disconnected")
    t_end = cap.t_end
    assert not cap.finish("error", 500, "a later fallback")
    assert (cap.status, cap.http_status, cap.error, cap.t_end) == ("aborted", None, "client disconnected", t_end)


async def _submitted(make_rig, monkeypatch, **overrides):
    rig = await make_rig(**overrides)
    recorder = rig.app[RECORDER_KEY]
    caps: list[Capture] = []
    submit = recorder.submit

    def spy(cap: Capture) -> None:
        caps.append(cap)
        submit(cap)

    monkeypatch.setattr(recorder, "submit", spy)
    return rig, caps


def _one(caps: list[Capture]) -> Capture:
    assert len(caps) == 1, [(c.request_id, c.status) for c in caps]
    assert caps[0].t_end is not None
    return caps[0]


@pytest.mark.parametrize(("headers", "outcome"), [
    ({}, ("ok", 200, True)),
    ({"x-fake-status": "500"}, ("error", 500, False)),  # the tap decides it: the status says error
    ({"x-fake-reject-tokens": "1"}, ("ok", 200, True)),  # asked again without our token fields
    ({"x-fake-raw": base64.b64encode(b'data: {"choices":[]}\n\n').decode()},
     ("error", 200, False)),  # cut before [DONE]
])
async def test_answered_requests_are_submitted_once(make_rig, monkeypatch, headers, outcome):
    rig, caps = await _submitted(make_rig, monkeypatch)
    status, _, _ = await rig.chat(BODY, headers)
    assert status == outcome[1]
    cap = _one(caps)
    assert (cap.status, cap.http_status, cap.done) == outcome


async def test_a_bad_body_is_submitted_once(make_rig, monkeypatch):
    rig, caps = await _submitted(make_rig, monkeypatch)
    async with rig.client.post(rig.url + "/v1/chat/completions", data=b"{not json",
                               headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400
    assert (_one(caps).status, caps[0].http_status) == ("error", 400)


async def test_an_unreachable_upstream_is_submitted_once(make_rig, monkeypatch):
    rig, caps = await _submitted(make_rig, monkeypatch, upstream="http://127.0.0.1:9")
    status, _, _ = await rig.chat(BODY)
    assert status == 502
    assert (_one(caps).status, caps[0].http_status) == ("error", 502)


async def test_a_bug_of_ours_is_submitted_once(make_rig, monkeypatch):
    rig, caps = await _submitted(make_rig, monkeypatch)

    def broken(*_a, **_k):
        raise RuntimeError("boom")

    monkeypatch.setattr(wire, "splice_fields", broken)
    status, _, body = await rig.chat(BODY)
    assert status == 500 and b"internal proxy error" in body
    cap = _one(caps)
    assert (cap.status, cap.http_status, cap.error) == ("error", 500, "proxy error: RuntimeError: boom")


async def test_a_client_hanging_up_mid_stream_is_submitted_once(make_rig, monkeypatch):
    rig, caps = await _submitted(make_rig, monkeypatch)
    async with aiohttp.ClientSession() as client:
        async with client.post(rig.url + "/v1/chat/completions", json=BODY,
                               headers={"x-fake-mode": "hang-mid"}) as r:
            await r.content.readany()
    # The done hook (it counts the abort) is the flow's last event: a second submission came before it.
    await until(lambda: rig.app[STATS_KEY].aborted == 1, "the hung-up request's done hook")
    cap = _one(caps)
    assert (cap.status, cap.error) == ("aborted", "client disconnected")


async def test_the_recorder_waits_for_a_quiet_moment_but_not_for_ever(rig, monkeypatch):
    from clawproxy.proxy import recorder as rec_mod

    busy = True
    rec = rig.app[RECORDER_KEY]
    monkeypatch.setattr(rec, "busy", lambda: busy)
    monkeypatch.setattr(rec_mod, "QUIET_WAIT_S", QUIET)
    await rig.chat(BODY)
    await until(lambda: rec.stats()["queue_depth"] == 0, "the recorder to take the turn")
    # Half the quiet wait: long enough for a recorder that ignores busy() to store it, short of the cap.
    await assert_stays(lambda: rec.recorded == 0, "streams are relayed: the store waits", QUIET / 2)
    await rig.wait_recorded(1, timeout=2.0)  # ... at most QUIET_WAIT_S
    busy = False
    t0 = time.monotonic()
    await rig.chat(BODY)
    await rig.wait_recorded(2, timeout=2.0)
    assert time.monotonic() - t0 < 0.5  # nothing in flight: at once


async def test_an_addon_that_raises_never_fails_the_request(rig, monkeypatch, caplog):
    from clawproxy.proxy.app import METRICS_KEY

    def broken(*_a, **_k):
        raise RuntimeError("addon bug")

    # Recording's outcome hook runs before [DONE] goes out; Metrics' done hook after the last byte.
    monkeypatch.setattr(rig.app[RECORDER_KEY], "submit", broken)
    monkeypatch.setattr(rig.app[METRICS_KEY], "observe", broken)
    status, _, body = await rig.chat(BODY)
    assert status == 200 and body.rstrip().endswith(b"data: [DONE]")
    failed = {r.getMessage().split(" failed")[0] for r in caplog.records if "addon hook" in r.getMessage()}
    assert failed == {"addon hook Recording.outcome", "addon hook Metrics.done"}
    assert (await rig.stats())["in_flight"] == 0  # the other addons' hooks still ran
