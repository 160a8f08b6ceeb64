"""What the dashboard's pages show and how they are served, against the in-process proxy rig: a
slow page never holds up the proxy, recorded text is escaped, a gate refusal is the trainer's
state, and a query parameter out of range is a JSON 400."""

from __future__ import annotations

import time

from clawproxy.store import Store
from tests.waits import until


async def test_a_slow_page_never_holds_up_the_proxy(make_rig, monkeypatch):
    # every dashboard read runs on its own thread: a page stuck in the store for 2 s leaves the
    # event loop, and so the requests it forwards, free
    import asyncio
    import threading

    rig = await make_rig()
    status, _, _ = await rig.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    await rig.wait_recorded(1)
    loop_thread = threading.current_thread()
    seen: list[threading.Thread] = []

    def slow(self, since):
        seen.append(threading.current_thread())
        time.sleep(2.0)
        return {"turns": 1, "sessions": 1}

    monkeypatch.setattr(Store, "turns_and_sessions_since", slow)
    t0 = time.monotonic()
    page = asyncio.create_task(rig.client.get(rig.url + "/clawproxy/ui/"))
    await until(lambda: seen, "the page to be inside its slow store read")
    status, _, _ = await rig.chat({"model": "m", "messages": [{"role": "user", "content": "meanwhile"}]})
    took = time.monotonic() - t0
    async with await page as r:
        assert r.status == 200
    assert status == 200 and took < 1.5, took
    assert seen and all(t is not loop_thread for t in seen)


async def test_recorded_text_is_escaped_and_any_session_id_has_a_page(make_rig):
    rig = await make_rig()
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    status, _, _ = await rig.chat({"model": "m", "messages": [{"role": "user", "content": evil}]},
                                  {"session_id": "team/a b"})
    assert status == 200
    await rig.wait_recorded(1)
    async with rig.client.get(rig.url + "/clawproxy/ui/sessions") as r:
        listing = await r.text()
    href = listing.split('href="/clawproxy/ui/sessions/', 1)[1].split('"', 1)[0]
    async with rig.client.get(rig.url + "/clawproxy/ui/sessions/" + href) as r:
        assert r.status == 200
        page = await r.text()
    assert "Session team/a b" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert "<img" not in page


async def test_a_gate_refusal_shows_as_the_trainers_state_and_is_marked(make_rig):
    rig = await make_rig()
    s = rig.store()
    try:  # what the trainer records when its publish gate refuses a step
        metrics = {"loss": 0.5, "kl": 9.0, "clip_frac": 0.1, "samples": 2,
                   "gate": {"ok": False, "failed": ["kl_to_previous"]}}
        step = s.record_step(method="combined", base_version=0, new_version=None, status="gate_failed",
                             metrics=metrics, objectives={})
    finally:
        s.close()
    async with rig.client.get(rig.url + "/clawproxy/ui/") as r:
        page = await r.text()
    assert 'id="trainer-state">gate refused<' in page
    assert f"step {step} from v0: kl_to_previous" in page
    async with rig.client.get(rig.url + "/clawproxy/ui/api/learning") as r:
        data = await r.json()
    assert [(st["id"], st["status"], st["failed"]) for st in data["steps"]] == [
        (step, "gate_failed", ["kl_to_previous"])]
    async with rig.client.get(rig.url + "/clawproxy/ui/learning") as r:
        assert f"step {step} refused by the gate: kl_to_previous" in await r.text()


async def test_query_parameters_out_of_range_are_a_json_400(make_rig):
    rig = await make_rig()
    status, _, _ = await rig.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    await rig.wait_recorded(1)
    live = rig.url + "/clawproxy/ui/api/live?after="
    for bad in ("99999999999999999999", "9223372036854775808", "-2", "abc", "1e3", "0x10"):
        async with rig.client.get(live + bad) as r:
            assert r.status == 400, bad
            assert r.content_type == "application/json", bad
            err = (await r.json())["error"]
            assert (err["param"], err["code"]) == ("after", "invalid_query"), bad
    for ok, n in (("-1", 0), ("0", 1), ("9223372036854775807", 0), ("", 1)):
        async with rig.client.get(live + ok) as r:
            assert r.status == 200, ok
            assert len((await r.json())["turns"]) == n, ok
