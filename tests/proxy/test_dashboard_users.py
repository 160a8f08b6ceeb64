"""The dashboard for many users, against the in-process proxy rig: one user's sessions, learning
and versions, and a rollback that moves only that user's adapter chain."""

from __future__ import annotations

import asyncio


async def test_the_sessions_page_shows_one_users_sessions(make_rig):
    from clawproxy.proxy.app import POLLER_KEY
    from tests.proxy.test_users import _add_users, _bearer

    rig = await make_rig()
    keys = _add_users(rig.cfg, ("alice", False), ("bob", False))
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    for name in keys:
        status, _, _ = await rig.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                                      {**_bearer(keys[name]), "session_id": "main"})
        assert status == 200
    await rig.wait_recorded(2)
    async with rig.client.get(rig.url + "/clawproxy/ui/sessions?user=alice") as r:
        listing = await r.text()
    assert "alice/main" in listing and "bob/main" not in listing
    assert '<option value="alice" selected>alice</option>' in listing  # the filter keeps its choice


async def test_learning_and_versions_show_one_users_adapter_and_roll_back_only_its_chain(make_rig, monkeypatch):
    from clawproxy.proxy import ui as ui_module
    from tests.proxy.test_users import _add_users

    rig = await make_rig()
    _add_users(rig.cfg, ("alice", False), ("bob", False), ("carl", True))
    s = rig.store()
    try:  # what the trainer and `clawproxy rollback --user alice` record
        shared = s.record_step(method="combined", base_version=0, new_version=5, status="published",
                               metrics={}, objectives={}, checkpoint={"path": "/s", "format": "lora", "gate": {"ok": True},
                                                                 "engine": True})
        ckpt = {"path": "/x", "format": "lora", "gate": {"ok": True}, "engine": True}
        a = s.record_step(method="combined", base_version=0, new_version=1, status="published",
                          metrics={"loss": 0.1}, objectives={}, checkpoint=ckpt, owner="alice")
        b = s.record_step(method="combined", base_version=0, new_version=2, status="published",
                          metrics={"loss": 0.2}, objectives={}, checkpoint=ckpt, owner="bob")
        s.record_rollback(3, "/x", "lora", target=0, from_version=1, engine=True, owner="alice")
    finally:
        s.close()
    ui = rig.url + "/clawproxy/ui"
    async with rig.client.get(ui + "/api/learning?user=alice") as r:
        mine = await r.json()
    assert [st["id"] for st in mine["steps"]] == [a]
    assert [r["new_version"] for r in mine["rollbacks"]] == [3]
    async with rig.client.get(ui + "/api/learning?user=bob") as r:
        theirs = await r.json()
    assert [st["id"] for st in theirs["steps"]] == [b] and theirs["rollbacks"] == []
    async with rig.client.get(ui + "/api/learning") as r:
        assert [st["id"] for st in (await r.json())["steps"]] == [shared, a, b]
    for path in ("/api/learning?user=carol", "/learning?user=carol", "/versions?user=carol", "/sessions?user=carol"):
        async with rig.client.get(ui + path) as r:
            assert r.status == 404, path
            assert "alice, bob" in (await r.json())["error"]["message"], path
    async with rig.client.get(ui + "/learning?user=alice") as r:
        page = await r.text()
    assert '<option value="alice" selected>alice</option>' in page
    # alice's page: her versions (the rollback serves v3), a rollback offered for v1 and the base, none for bob's v2
    async with rig.client.get(ui + "/versions?user=alice") as r:
        page = await r.text()
    assert 'data-version="1"' in page and 'data-version="3"' in page and 'data-version="2"' not in page
    assert 'id="rollback-1"' in page and 'id="rollback-0"' in page and 'id="rollback-3"' not in page
    assert page.count('<input type="hidden" name="user" value="alice">') == 2
    # carl shares and has no adapter of his own: the shared v5 serves him, and nothing of his can move
    async with rig.client.get(ui + "/versions?user=carl") as r:
        page = await r.text()
    assert 'id="current-version">v5<' in page and 'id="rollback-' not in page
    # everyone's page: no user adapter is rolled back from there (its rollback moves the shared chain)
    async with rig.client.get(ui + "/versions") as r:
        page = await r.text()
    assert 'data-version="2"' in page and 'id="rollback-1"' not in page and 'id="rollback-2"' not in page
    assert 'id="rollback-0"' in page  # the shared chain, serving v5, can go back to the base
    token = page.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]

    argvs = []

    class Done:
        returncode = 0

        async def communicate(self):
            return b"now serving v4 to alice\n", b""

    async def spawn(*argv, **_kw):
        argvs.append(argv)
        return Done()

    monkeypatch.setattr(ui_module.asyncio, "create_subprocess_exec", spawn)
    async with rig.client.post(ui + "/versions/rollback", data={"version": "1", "user": "alice", "csrf": token},
                               headers={"Origin": rig.url}, allow_redirects=False) as r:
        assert r.status == 303
        assert r.headers["Location"].endswith("/versions?user=alice&done=now+serving+v4+to+alice")
    assert argvs[0][3:7] == ("rollback", "1", "--user", "alice")
