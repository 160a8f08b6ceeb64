"""The dashboard's memory page: what each user told the model, in their words, escaped."""

from __future__ import annotations

import asyncio
import json
import threading

from judge.voters import LexicalVoter
from judge.worker import Worker


async def test_the_memory_page_shows_one_users_reactions_and_the_overview_counts_abstentions(make_rig):
    from clawproxy.proxy.app import POLLER_KEY
    from tests.proxy.test_users import _add_users, _bearer

    rig = await make_rig()
    keys = _add_users(rig.cfg, ("alice", False), ("bob", False))
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    said = {"alice": "<b>way</b> too long, three bullet points please", "bob": "perfect, thank you!"}
    for name, key in keys.items():
        history = [{"role": "user", "content": "summarize the report"}]
        status, _, body = await rig.chat({"model": "m", "messages": history}, {**_bearer(key), "session_id": "s"})
        assert status == 200
        answer = json.loads(body)["choices"][0]["message"]["content"]
        history += [{"role": "assistant", "content": answer}, {"role": "user", "content": said[name]}]
        status, _, _ = await rig.chat({"model": "m", "messages": history}, {**_bearer(key), "session_id": "s"})
        assert status == 200
    await rig.wait_recorded(4)
    store = rig.store()
    try:  # the judge, as `clawproxy judge run` does it
        assert Worker(store, LexicalVoter(), votes=3).run(False, 0.01, threading.Event()) == 2
    finally:
        store.close()
    async with rig.client.get(rig.url + "/clawproxy/ui/memory?user=alice") as r:
        assert r.status == 200
        page = await r.text()
    assert "&lt;b&gt;way&lt;/b&gt; too long, three bullet points please" in page and "<b>way" not in page
    assert "complained" in page and "summarize the report" in page and "perfect, thank you" not in page
    async with rig.client.get(rig.url + "/clawproxy/ui/memory?user=bob") as r:
        page = await r.text()
    assert "perfect, thank you!" in page and "praised" in page and "bullet points" not in page
    async with rig.client.get(rig.url + "/clawproxy/ui/memory?user=carol") as r:
        assert r.status == 404
    async with rig.client.get(rig.url + "/clawproxy/ui/") as r:
        assert 'id="judge-verdicts">2 scored, 0 abstained (too unsure), 0 neutral<' in await r.text()


async def test_the_memory_page_shows_what_trying_found_for_that_user_only(make_rig):
    from clawproxy.config import TryingConfig
    from clawproxy.proxy.app import POLLER_KEY
    from judge.trying import Trier
    from tests.proxy.test_users import _add_users, _bearer

    rig = await make_rig()
    keys = _add_users(rig.cfg, ("alice", False), ("bob", False))
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    said = {"alice": "<i>far</i> too wordy, trim it", "bob": "perfect, thank you!"}
    for name, key in keys.items():
        history = [{"role": "user", "content": "summarize the report"}]
        status, _, body = await rig.chat({"model": "m", "messages": history}, {**_bearer(key), "session_id": "s"})
        answer = json.loads(body)["choices"][0]["message"]["content"]
        history += [{"role": "assistant", "content": answer}, {"role": "user", "content": said[name]}]
        status, _, _ = await rig.chat({"model": "m", "messages": history}, {**_bearer(key), "session_id": "s"})
        assert status == 200
    await rig.wait_recorded(4)
    store = rig.store()
    try:
        worker = Worker(store, LexicalVoter(), votes=3, trier=Trier(store, TryingConfig(shortlist=4)))
        assert worker.run(False, 0.01, threading.Event()) == 2
        assert store.preferences_of("bob") == [] and len(store.preferences_of("alice")) == 4
    finally:
        store.close()
    async with rig.client.get(rig.url + "/clawproxy/ui/memory?user=alice") as r:
        page = await r.text()
    assert 'id="preferences"' in page and "&lt;i&gt;far&lt;/i&gt; too wordy, trim it" in page and "<i>far" not in page
    assert page.count("shortlisted") == 4 and "0 of 2 answer(s) served under a candidate" in page
    async with rig.client.get(rig.url + "/clawproxy/ui/memory?user=bob") as r:
        page = await r.text()
    assert "nothing tried yet" in page and "shortlisted" not in page
