"""`clawproxy users add|list|share|remove` and `sessions --user`, against a proxy that records the
users' turns in front of a fake vLLM."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from click.testing import CliRunner

from clawproxy.cli import main
from clawproxy.proxy.app import POLLER_KEY
from tests.engine.test_vllm_contract import write_adapter
from tests.fakes.fake_vllm import CALLS, STATE, create_fake_vllm

MODEL = "Qwen/Qwen3-4B"
ASK = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture
async def setup(aiohttp_server, make_rig, tmp_path):
    vllm = await aiohttp_server(create_fake_vllm(model=MODEL))
    url = str(vllm.make_url("")).rstrip("/")
    rig = await make_rig(upstream=url, **{"engine.kind": "vllm", "engine.model": MODEL, "trainer.finetune": "lora"})
    config = tmp_path / "c.yaml"
    config.write_text(f"proxy:\n  upstream: {url}\nengine:\n  kind: vllm\n  model: {MODEL}\n"
                      "trainer:\n  finetune: lora\n")
    return rig, vllm.app, config


async def _cli(config, rig, *args, ok=True):
    # a thread: `users remove` talks to the fake vLLM, which this event loop serves
    r = await asyncio.to_thread(CliRunner().invoke, main, [*args, "--config", str(config),
                                                           "--data-dir", rig.cfg.data_dir],
                                env={"COLUMNS": "200"})
    assert (r.exit_code == 0) == ok, r.output
    return r.output


async def test_add_list_share_remove(setup, tmp_path):
    rig, app, config = setup
    keys = {}
    for name, share in (("alice", "--no-share"), ("bob", "--share")):
        out = await _cli(config, rig, "users", "add", name, share)
        keys[name] = re.search(r"clawproxy openclaw-config --api-key (cpk-\S+) --write", out).group(1)
        assert out.count(keys[name]) == 2  # the key, and the line for that person
    out = await _cli(config, rig, "users", "add", "alice", ok=False)
    assert "exists" in out and "users remove alice" in out
    assert "use 1-32 lower-case" in await _cli(config, rig, "users", "add", "Al/ice", ok=False)

    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    for name in ("alice", "bob"):
        status, _, body = await rig.chat(ASK, {"Authorization": f"Bearer {keys[name]}", "x-session-id": "main"})
        assert status == 200, body
    await rig.wait_recorded(2)
    store = rig.store()
    dirs = {}
    for v, owner in ((1, "alice"), (2, "bob")):
        dirs[owner] = write_adapter(tmp_path / "ck" / owner)
        store.insert("checkpoints", {"version": v, "path": str(dirs[owner]), "kind": "lora",
                                     "created_at": 0.0, "status": "published", "user": owner})
    store.close()
    app[STATE]["loras"]["clawproxy-u-alice"] = str(dirs["alice"])

    listed = json.loads(await _cli(config, rig, "users", "list", "--json"))
    assert [(u["name"], u["shared"], u["turns"], u["version"]) for u in listed] == [
        ("alice", False, 1, 1), ("bob", True, 1, 2)]
    text = await _cli(config, rig, "users")
    assert "alice" in text and "v2" in text
    for out in (json.dumps(listed), text):
        assert "cpk-" not in out and "key" not in out

    await _cli(config, rig, "users", "share", "alice", "--on")
    assert json.loads(await _cli(config, rig, "users", "list", "--json"))[0]["shared"] is True
    assert "no user 'zed'" in await _cli(config, rig, "users", "share", "zed", "--off", ok=False)

    sessions = json.loads(await _cli(config, rig, "sessions", "list", "--json", "--user", "bob"))
    assert [s["id"] for s in sessions] == ["bob/main"]

    app[STATE]["loras"]["clawproxy-u-bob"] = str(dirs["bob"])
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    for name in ("alice", "bob"):
        again = {**ASK, "messages": [{"role": "user", "content": "hi again"}]}  # not a retry of the first
        assert (await rig.chat(again, {"Authorization": f"Bearer {keys[name]}", "x-session-id": "main"}))[0] == 200
    await rig.wait_recorded(4)
    mine = json.loads(await _cli(config, rig, "stats", "--user", "alice", "--json"))
    assert mine["current_version"] == 1
    assert [(v["version"], v["served_turns"]) for v in mine["versions"]] == [(0, 1), (1, 1)]
    everyone = json.loads(await _cli(config, rig, "stats", "--json"))
    assert [(v["version"], v["served_turns"]) for v in everyone["versions"]] == [(0, 2), (1, 1), (2, 1)]
    assert "no user 'zed'" in await _cli(config, rig, "stats", "--user", "zed", ok=False)

    out = await _cli(config, rig, "users", "remove", "alice", "--yes")
    assert "the engine unloaded their adapter" in out
    assert [b for m, p, b in app[CALLS] if p == "/v1/unload_lora_adapter"] == [{"lora_name": "clawproxy-u-alice"}]
    assert not dirs["alice"].exists() and dirs["bob"].exists()
    store = rig.store()
    try:
        assert [r["user"] for r in store.query("SELECT user FROM turns")] == ["bob", "bob"]
        assert [r["id"] for r in store.query("SELECT id FROM sessions")] == ["bob/main"]
        assert [r["user"] for r in store.query("SELECT user FROM checkpoints")] == ["bob"]
        assert [u["name"] for u in store.list_users()] == ["bob"]
    finally:
        store.close()
    assert "no user 'alice'" in await _cli(config, rig, "users", "remove", "alice", "--yes", ok=False)


async def test_remove_asks_first(setup):
    rig, _, config = setup
    await _cli(config, rig, "users", "add", "alice")
    r = await asyncio.to_thread(CliRunner().invoke, main, ["users", "remove", "alice", "--config", str(config),
                                                           "--data-dir", rig.cfg.data_dir], input="n\n")
    assert r.exit_code != 0 and "Remove user alice" in r.output
    assert "alice" in await _cli(config, rig, "users", "list")


async def test_prefer_show_unprefer_and_trying_off(setup):
    rig, app, config = setup
    await _cli(config, rig, "users", "add", "ann")
    await _cli(config, rig, "users", "add", "ben")
    out = await _cli(config, rig, "users", "prefer", "ann", "Answer in bullet points.")
    pid = int(re.search(r"preference (\d+) active", out).group(1))
    shown = json.loads(await _cli(config, rig, "users", "show", "ann", "--json"))
    assert [(p["id"], p["status"], p["text"], p["source"], p["served"]) for p in shown["preferences"]] == [
        (pid, "active", "Answer in bullet points.", "manual", "in the prompt, being distilled")]
    assert shown["trying"] == {"turns": 0, "tried": 0, "counted": 0, "on": True}
    assert json.loads(await _cli(config, rig, "users", "show", "ben", "--json"))["preferences"] == []
    table = await _cli(config, rig, "users", "show", "ann")
    assert "what was found by trying" in table and "Answer in bullet points." in table
    # ben cannot remove ann's, a typo says how to find the id, a proxy with users needs a name
    out = await _cli(config, rig, "users", "unprefer", "ben", str(pid), ok=False)
    assert "users show" in out
    out = await _cli(config, rig, "users", "prefer", "Be brief.", ok=False)
    assert "name one" in out
    out = await _cli(config, rig, "users", "unprefer", "ann", str(pid))
    assert "removed preference" in out
    assert json.loads(await _cli(config, rig, "users", "show", "ann", "--json"))["preferences"] == []
    await _cli(config, rig, "users", "trying", "ann", "--off")
    assert json.loads(await _cli(config, rig, "users", "show", "ann", "--json"))["trying"]["on"] is False


async def test_show_piped_to_a_file_keeps_a_preference_on_one_line(setup):
    rig, app, config = setup
    await _cli(config, rig, "users", "add", "ann")
    wish = ("Answer in one short paragraph, lead with the answer itself, and leave out the background "
            "unless I ask for it.")
    await _cli(config, rig, "users", "prefer", "ann", wish)
    # no COLUMNS and no terminal, as `clawproxy users show ann > file` runs: rich alone would use 80
    r = await asyncio.to_thread(CliRunner().invoke, main, ["users", "show", "ann", "--config", str(config),
                                                           "--data-dir", rig.cfg.data_dir], env={"COLUMNS": None})
    assert r.exit_code == 0, r.output
    assert any(wish[:90] in line for line in r.output.splitlines()), r.output  # in 80 columns: 9 a line
