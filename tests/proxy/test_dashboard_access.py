"""The dashboard's access rules, against the in-process proxy rig: the token off loopback, CSRF on
every action, and no page or action for a name that is not this host's (DNS rebinding)."""

from __future__ import annotations

PAGES = ["", "/", "/sessions", "/sessions/x", "/learning", "/versions", "/api/live", "/api/learning",
         "/static/chart.umd.js"]


async def test_off_loopback_without_the_token_gets_401(make_rig):
    rig = await make_rig(**{"proxy.host": "0.0.0.0", "proxy.control_token": "t0k"})
    for page in PAGES:
        async with rig.client.get(rig.url + "/clawproxy/ui" + page) as r:
            assert r.status == 401, page
            assert (await r.json())["error"]["type"] == "authentication_error"
        async with rig.client.get(rig.url + "/clawproxy/ui" + page, headers={"Authorization": "Bearer t0k"}) as r:
            assert r.status == (404 if page == "/sessions/x" else 200), page
    async with rig.client.post(rig.url + "/clawproxy/ui/versions/rollback", data={"version": "0"}) as r:
        assert r.status == 401


async def test_a_post_without_the_csrf_token_is_refused(make_rig):
    rig = await make_rig()
    async with rig.client.get(rig.url + "/clawproxy/ui/versions") as r:
        page = await r.text()
    token = page.split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
    assert len(token) >= 32
    url = rig.url + "/clawproxy/ui/versions/rollback"
    same = {"Origin": rig.url}  # what a browser sends with the dashboard's own form
    for form, headers in (({"version": "0"}, same), ({"version": "0", "csrf": "x" * 43}, same),
                          ({"version": "0"}, {"X-CSRF-Token": token[:-1], **same})):
        async with rig.client.post(url, data=form, headers=headers, allow_redirects=False) as r:
            assert r.status == 403 and (await r.json())["error"]["code"] == "csrf"
    # with the page's token the action goes through (here: refused for its bad version, not for CSRF)
    for form, headers in (({"version": "v0", "csrf": token}, same),
                          ({"version": "v0"}, {"X-CSRF-Token": token, "Sec-Fetch-Site": "same-origin"})):
        async with rig.client.post(url, data=form, headers=headers, allow_redirects=False) as r:
            assert r.status == 303 and "error=not+a+version" in r.headers["Location"]
    async with rig.client.get(rig.url + "/clawproxy/ui/versions") as r:  # a new GET, the same token
        assert token in await r.text()


async def test_a_rebound_dns_name_cannot_read_the_dashboard_or_act(make_rig):
    # DNS rebinding: evil.example resolves to 127.0.0.1, so the browser connects from loopback but
    # sends the page's own name as Host and Origin. Neither a page nor a control route answers it.
    rig = await make_rig(**{"proxy.allowed_hosts": ["clawproxy.lan"]})
    port = rig.url.rsplit(":", 1)[1]
    evil = {"Host": f"evil.example:{port}"}
    for path in [*("/clawproxy/ui" + p for p in PAGES), "/clawproxy/stats", "/clawproxy/health", "/metrics"]:
        async with rig.client.get(rig.url + path, headers=evil, allow_redirects=False) as r:
            assert r.status == 403, path
            assert (await r.json())["error"]["code"] == "host_not_allowed", path
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"clawproxy.lan:{port}",
                     f"LocalHost:{port}"):
            async with rig.client.get(rig.url + path, headers={"Host": host}, allow_redirects=False) as r:
                assert r.status in (200, 302, 404), (path, host, r.status)  # /sessions/x: 404
    async with rig.client.get(rig.url + "/clawproxy/ui/versions") as r:
        token = (await r.text()).split('name="csrf-token" content="', 1)[1].split('"', 1)[0]
    url = rig.url + "/clawproxy/ui/versions/rollback"
    form = {"version": "0", "csrf": token}
    # the token alone is not enough: the action must come from a page of this origin
    for headers in ({"Origin": "http://evil.example"}, {"Origin": f"http://evil.example:{port}"},
                    {"Origin": "null"}, {}, {"Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site", "Origin": rig.url}):
        async with rig.client.post(url, data=form, headers=headers, allow_redirects=False) as r:
            assert r.status == 403, headers
            assert (await r.json())["error"]["code"] == "cross_origin", headers
    async with rig.client.post(url, data=form, allow_redirects=False,
                               headers={**evil, "Origin": f"http://evil.example:{port}"}) as r:
        assert r.status == 403 and (await r.json())["error"]["code"] == "host_not_allowed"
    s = rig.store()
    try:
        assert s.events_of("rollback") == []  # nothing ran
    finally:
        s.close()
