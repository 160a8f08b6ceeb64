"""Many people on one proxy: each request is a user's (by API key, or by a trusted front end's
header), goes to that user's adapter (own, else the shared one if they share, else the base
model), and is recorded as theirs; the key reaches neither vLLM nor the store."""

from __future__ import annotations

import asyncio
import json

import pytest

from clawproxy.proxy.app import POLLER_KEY
from clawproxy.store import Store
from clawproxy.users import key_hash, new_key, secret
from tests.engine.test_vllm_contract import write_adapter
from tests.fakes.fake_vllm import CALLS, STATE, create_fake_vllm, restart

MODEL = "Qwen/Qwen3-4B"
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _add_users(cfg, *users: tuple[str, bool]) -> dict[str, str]:
    """What `clawproxy users add` stores; name -> key."""
    sec = secret(cfg.data_path, create=True)
    store = Store(cfg.db_path)
    keys = {}
    for name, shared in users:
        keys[name] = new_key()
        store.add_user(name, key_hash(sec, keys[name]), shared=shared)
    store.close()
    return keys


def _publish(cfg, app, version: int, owner: str | None, path) -> None:
    """What the trainer does: load the adapter into vLLM, then record it as published."""
    name = "clawproxy" if owner is None else f"clawproxy-u-{owner}"
    app[STATE]["loras"][name] = str(path)
    store = Store(cfg.db_path)
    store.insert("checkpoints", {"version": version, "path": str(path), "kind": "lora", "created_at": 0.0,
                                 "status": "published", "user": owner})
    store.close()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _models_sent(app) -> list[str]:
    return [b["model"] for m, p, b in app[CALLS] if p == "/v1/chat/completions"]


@pytest.fixture
async def vllm_rig(aiohttp_server, make_rig, tmp_path):
    vllm = await aiohttp_server(create_fake_vllm(model=MODEL))
    rig = await make_rig(upstream=str(vllm.make_url("")).rstrip("/"), **{
        "engine.kind": "vllm", "engine.model": MODEL, "trainer.finetune": "lora"})
    return rig, vllm.app


async def test_each_user_gets_their_own_adapter_the_shared_one_or_the_base_model(vllm_rig, tmp_path):
    rig, app = vllm_rig
    keys = _add_users(rig.cfg, ("alice", False), ("bob", True), ("carol", True), ("dave", False))
    _publish(rig.cfg, app, 1, None, write_adapter(tmp_path / "shared"))
    _publish(rig.cfg, app, 2, "alice", write_adapter(tmp_path / "alice"))
    _publish(rig.cfg, app, 3, "bob", write_adapter(tmp_path / "bob"))
    await asyncio.to_thread(rig.app[POLLER_KEY].once)  # the poll would, within a second
    for name in ("alice", "bob", "carol", "dave"):
        status, _, body = await rig.chat(ASK, _bearer(keys[name]))
        assert status == 200, body
    # carol has no adapter of her own and shares; dave neither: never weights trained on others
    assert _models_sent(app) == ["clawproxy-u-alice", "clawproxy-u-bob", "clawproxy", MODEL]
    # naming another user's adapter still gets your own
    status, _, _ = await rig.chat({**ASK, "model": "clawproxy-u-alice"}, _bearer(keys["dave"]))
    assert status == 200 and _models_sent(app)[-1] == MODEL
    await rig.wait_recorded(5)
    turns = rig.turns()
    assert [(t["user"], t["weight_version"]) for t in turns] == [
        ("alice", 2), ("bob", 3), ("carol", 1), ("dave", 0), ("dave", 0)]


async def test_a_user_adapter_lost_by_a_restart_is_loaded_again_under_its_name(vllm_rig, tmp_path):
    rig, app = vllm_rig
    keys = _add_users(rig.cfg, ("alice", False))
    path = write_adapter(tmp_path / "alice")
    _publish(rig.cfg, app, 1, "alice", path)
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    restart(app)
    status, _, body = await rig.chat(ASK, _bearer(keys["alice"]))
    assert status == 200, body
    assert app[STATE]["loras"] == {"clawproxy-u-alice": str(path)}
    assert _models_sent(app) == ["clawproxy-u-alice", "clawproxy-u-alice"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer cpk-not-a-key"},
                                     {"Authorization": "Basic Zm9vOmJhcg=="}])
async def test_unknown_or_missing_key_is_a_401_in_openai_json(make_rig, headers):
    rig = await make_rig()
    _add_users(rig.cfg, ("alice", False))
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    status, h, body = await rig.chat(ASK, headers)
    assert status == 401 and h["WWW-Authenticate"] == "Bearer"
    err = json.loads(body)["error"]
    assert err["code"] == "invalid_api_key" and err["type"] == "authentication_error"
    assert "clawproxy users add NAME" in err["message"] and "openclaw-config --api-key" in err["message"]
    assert rig.fake.received == []


async def test_the_key_reaches_neither_the_upstream_nor_the_store(make_rig):
    rig = await make_rig()
    keys = _add_users(rig.cfg, ("alice", False))
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    status, _, body = await rig.chat({**ASK, "stream": True}, _bearer(keys["alice"]))
    assert status == 200, body
    async with rig.client.get(rig.url + "/v1/models", headers=_bearer(keys["alice"])) as r:
        assert r.status == 200
    pasted = {**ASK, "messages": [{"role": "user", "content": f"my key is {keys['alice']}"}]}
    assert (await rig.chat(pasted, _bearer(keys["alice"])))[0] == 200  # redacted like any other key
    await rig.wait_recorded(2)
    assert [r.headers.get("Authorization") for r in rig.fake.received] == [None, None, None]
    assert [t["user"] for t in rig.turns()] == ["alice", "alice"]
    data = b"".join(p.read_bytes() for p in rig.cfg.data_path.rglob("*") if p.is_file() and p.name != "users.secret")
    assert keys["alice"].encode() not in data and keys["alice"][4:].encode() not in data


async def test_same_session_id_from_two_users_is_two_sessions(make_rig):
    rig = await make_rig()
    keys = _add_users(rig.cfg, ("alice", False), ("bob", False))
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    for name in ("alice", "bob"):
        status, _, _ = await rig.chat(ASK, {**_bearer(keys[name]), "x-session-id": "main"})
        assert status == 200
    await rig.wait_recorded(2)
    store = rig.store()
    try:
        sessions = store.query("SELECT id, user FROM sessions ORDER BY id")
    finally:
        store.close()
    assert sessions == [{"id": "alice/main", "user": "alice"}, {"id": "bob/main", "user": "bob"}]


async def test_content_never_links_turns_of_two_users(make_rig):
    """The next request of a conversation with no session id links to its session by the prompt
    it repeats; the same words from another user start their own session."""
    rig = await make_rig()
    keys = _add_users(rig.cfg, ("alice", False), ("bob", False))
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    first = {"model": MODEL, "messages": [{"role": "user", "content": "what is 2+2?"}]}
    assert (await rig.chat(first, _bearer(keys["alice"])))[0] == 200
    await rig.wait_recorded(1)
    answer = rig.turns()[0]["response_text"]
    follow = {"model": MODEL, "messages": [*first["messages"], {"role": "assistant", "content": answer},
                                           {"role": "user", "content": "and 3+3?"}]}
    assert (await rig.chat(follow, _bearer(keys["bob"])))[0] == 200
    assert (await rig.chat(first, _bearer(keys["bob"])))[0] == 200  # not a retry of alice's
    await rig.wait_recorded(3)
    turns = rig.turns()
    assert [t["user"] for t in turns] == ["alice", "bob", "bob"]
    assert turns[1]["session_id"].startswith("bob/") and turns[1]["session_id"] != turns[0]["session_id"]
    assert turns[2]["kind"] == "main" and turns[2]["session_id"].startswith("bob/")
    assert turns[0]["next_state"] is None


async def test_a_trusted_header_names_the_user(make_rig):
    rig = await make_rig(**{"proxy.user_header": "X-Forwarded-User"})
    _add_users(rig.cfg, ("alice", False))
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    assert (await rig.chat(ASK, {"X-Forwarded-User": "alice"}))[0] == 200
    status, _, body = await rig.chat(ASK, {"X-Forwarded-User": "mallory"})
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    assert (await rig.chat(ASK))[0] == 401
    await rig.wait_recorded(1)
    assert [t["user"] for t in rig.turns()] == ["alice"]


async def test_off_loopback_a_user_key_opens_v1_but_not_the_control_routes(make_rig):
    rig = await make_rig(**{"proxy.host": "0.0.0.0", "proxy.control_token": "ctl"})
    keys = _add_users(rig.cfg, ("alice", False))
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    assert (await rig.chat(ASK, _bearer(keys["alice"])))[0] == 200
    async with rig.client.get(rig.url + "/clawproxy/stats", headers=_bearer(keys["alice"])) as r:
        assert r.status == 401
    async with rig.client.get(rig.url + "/metrics", headers=_bearer(keys["alice"])) as r:
        assert r.status == 401


async def test_a_store_with_no_users_needs_no_key_and_forwards_the_clients_own(make_rig):
    rig = await make_rig()
    status, _, _ = await rig.chat(ASK, {"Authorization": "Bearer upstream-key"})
    assert status == 200
    await rig.wait_recorded(1)
    assert rig.fake.received[0].headers["Authorization"] == "Bearer upstream-key"
    assert rig.turns()[0]["user"] is None


async def test_no_route_reaches_another_users_adapter_by_its_name(vllm_rig, tmp_path):
    rig, app = vllm_rig
    keys = _add_users(rig.cfg, ("alice", False), ("bob", False))
    _publish(rig.cfg, app, 1, "alice", write_adapter(tmp_path / "alice"))
    _publish(rig.cfg, app, 2, "bob", write_adapter(tmp_path / "bob"))
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    for model in ("clawproxy-u-bob", "clawproxy", MODEL):
        async with rig.client.post(rig.url + "/v1/completions", json={"model": model, "prompt": "hi"},
                                   headers=_bearer(keys["alice"])):
            pass
    assert [b["model"] for m, p, b in app[CALLS] if p == "/v1/completions"] == [
        "clawproxy-u-alice", "clawproxy-u-alice", MODEL]  # the base model stays as asked


async def test_the_model_list_shows_a_user_only_what_serves_them(vllm_rig, tmp_path):
    rig, app = vllm_rig
    keys = _add_users(rig.cfg, ("alice", False), ("bob", True), ("carol", False))
    _publish(rig.cfg, app, 1, None, write_adapter(tmp_path / "shared"))
    _publish(rig.cfg, app, 2, "alice", write_adapter(tmp_path / "alice"))
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    seen = {}
    for name in ("alice", "bob", "carol"):
        async with rig.client.get(rig.url + "/v1/models", headers=_bearer(keys[name])) as r:
            assert r.status == 200
            seen[name] = [m["id"] for m in (await r.json())["data"]]
    # adapter names carry user names: nobody sees another person's, nor the shared one unless it serves them
    assert seen == {"alice": [MODEL, "clawproxy-u-alice"], "bob": [MODEL, "clawproxy"], "carol": [MODEL]}
