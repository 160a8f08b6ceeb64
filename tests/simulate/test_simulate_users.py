"""`clawproxy simulate --users`: several simulated users on one proxy, each with their own key, turns,
adapter, curve and cross-talk figures."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner

from clawproxy.proxy.app import POLLER_KEY
from clawproxy.simulate.cli import simulate as simulate_cmd
from clawproxy.simulate.multi import add_users, cross_personas, simulate_users
from clawproxy.simulate.personas import PREFERENCES
from clawproxy.simulate.prompts import HELDOUT_PROMPTS
from clawproxy.simulate.run import SimSettings
from clawproxy.store import Store
from clawproxy.users import key_hash, secret
from tests.engine.test_vllm_contract import write_adapter
from tests.fakes.fake_vllm import CALLS, STATE, create_fake_vllm
from tests.simulate.test_simulate_driver import LearningFake, ThreadedServer

MODEL = "Qwen/Qwen3-4B"
PERSONAS = ["concise", "concise", "bullets"]


def test_cross_talk_pairs_the_run_personas():
    assert cross_personas("concise", PERSONAS) == ["bullets"]
    assert cross_personas("bullets", PERSONAS) == ["concise"]
    assert cross_personas("concise", ["concise", "concise"]) == ["bullets"]  # none other: the opposite
    assert cross_personas("no_filler", ["no_filler", "concise", "bullets"]) == ["bullets", "concise"]


def test_users_are_stored_as_users_add_stores_them(tmp_path):
    users = add_users(tmp_path, PERSONAS, share=True)
    assert [(u.name, u.persona, u.shared) for u in users] == [
        ("u1-concise", "concise", True), ("u2-concise", "concise", True), ("u3-bullets", "bullets", True)]
    sec = secret(tmp_path)
    store = Store(tmp_path / "clawproxy.db")
    try:
        for u in users:
            assert store.user_by_key_hash(key_hash(sec, u.key))["name"] == u.name
        assert store.shared_users() == [u.name for u in users]
    finally:
        store.close()
    with pytest.raises(Exception, match="already exist.*fresh --data-dir"):
        add_users(tmp_path, PERSONAS)


async def test_each_user_is_recorded_measured_on_their_adapter_and_crossed(aiohttp_server, make_rig, tmp_path):
    vllm = await aiohttp_server(create_fake_vllm(model=MODEL))
    vllm_url = str(vllm.make_url("")).rstrip("/")
    rig = await make_rig(upstream=vllm_url, **{"engine.kind": "vllm", "engine.model": MODEL,
                                                "trainer.finetune": "lora"})
    users = add_users(rig.cfg.data_path, PERSONAS)
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    adapter = write_adapter(tmp_path / "u1")

    def publish_u1_once(user, it) -> None:
        """What the trainer does after u1's first interaction: load u1's adapter, record it published."""
        if user.name != "u1-concise" or "clawproxy-u-u1-concise" in vllm.app[STATE]["loras"]:
            return
        vllm.app[STATE]["loras"]["clawproxy-u-u1-concise"] = str(adapter)
        store = Store(rig.cfg.db_path)
        store.insert("checkpoints", {"version": 1, "path": str(adapter), "kind": "lora", "created_at": 0.0,
                                     "status": "published", "user": "u1-concise"})
        store.close()

    s = SimSettings(proxy_url=rig.url, eval_url=vllm_url, data_dir=str(rig.cfg.data_path), interactions=4,
                    eval_every=2, turns_per_conversation=2, oracle=True, trainer_batch_size=100,
                    engine_kind="vllm", model=MODEL, settle_stall_s=5)
    curves = await simulate_users(s, users, on_interaction=publish_u1_once)
    await rig.wait_recorded(3 * 2 * 3)  # each user: two conversations of two turns and a closing call

    # each user's conversations are recorded as theirs, in their own sessions
    turns = rig.turns()
    by_user = {u.name: [t for t in turns if t["user"] == u.name] for u in users}
    assert all(len(ts) == 6 for ts in by_user.values()), {k: len(v) for k, v in by_user.items()}
    assert all(t["session_id"].startswith(f"{t['user']}/sim-") for t in turns)

    # a curve per user, at 0 and every 2 interactions, each on the weights that served that user
    assert [(c.user, c.persona) for c in curves] == [(u.name, u.persona) for u in users]
    for c in curves:
        assert [p.interactions for p in c.points] == [0, 2, 4]
    served = {c.user: [p.served_by for p in c.points] for c in curves}
    assert served == {"u1-concise": [MODEL, "clawproxy-u-u1-concise", "clawproxy-u-u1-concise"],
                      "u2-concise": [MODEL] * 3, "u3-bullets": [MODEL] * 3}
    assert [p.weight_version for p in curves[0].points] == [0, 1, 1]
    heldout = [b["model"] for m, p, b in vllm.app[CALLS]
               if p == "/v1/chat/completions" and b.get("temperature") == 0.0]
    n = len(HELDOUT_PROMPTS)
    # point 0: one base pass serves all three; then u1's own adapter, and one base pass for u2 and u3
    assert heldout == [MODEL] * n + (["clawproxy-u-u1-concise"] * n + [MODEL] * n) * 2

    # cross-talk: concise users scored with the bullets check, the bullets user with the concise one
    for c in curves:
        other = "bullets" if c.persona == "concise" else "concise"
        assert set(c.cross_baseline) == {other} and 0.0 <= c.cross_baseline[other] <= 1.0
        for p in c.points:
            assert set(p.cross_talk) == {other}
            expected = sum(PREFERENCES[other].check(a.answer) and a.degenerate is None and not a.cut_off
                           and a.similarity >= s.on_topic_min for a in p.answers) / len(p.answers)
            assert p.cross_talk[other] == expected
        assert c.settings["baseline"] == "base model" and c.trained == 0

    # the oracle judged each user's turns by that user's own persona
    store = Store(rig.cfg.db_path)
    try:
        rows = store.query("SELECT t.user, t.response_text, j.score, j.hint, j.voter FROM judgments j "
                           "JOIN turns t ON t.id = j.turn_id")
    finally:
        store.close()
    persona = {u.name: PREFERENCES[u.persona] for u in users}
    assert {r["user"] for r in rows} == {u.name for u in users}
    for r in rows:
        pref = persona[r["user"]]
        assert r["voter"] == "oracle" and r["score"] == (1 if pref.check(r["response_text"]) else -1)
        assert r["hint"] == (None if r["score"] == 1 else pref.hint)
    assert any(r["hint"] == PREFERENCES["bullets"].hint for r in rows)  # the canned answer is no list


def test_simulate_cli_users_sends_each_key_and_writes_a_curve_each(tmp_path):
    fake = LearningFake(learn_after=3)
    server = ThreadedServer(fake.app())
    data = tmp_path / "data"
    try:
        url = f"http://127.0.0.1:{server.port}"
        res = CliRunner().invoke(simulate_cmd, [
            "--proxy-url", url, "--engine-url", url, "--data-dir", str(data), "--users", "concise,concise,bullets",
            "--interactions", "2", "--eval-every", "2", "--turns", "2", "--out", str(tmp_path / "sim")],
            catch_exceptions=False)
        assert res.exit_code == 0, res.output
    finally:
        server.close()
    # each driver talks with its own user's key, round-robin: u1, u2, u3
    main = [r for r in fake.requests if r["body"].get("temperature") != 0.0]
    keys = [r["headers"]["Authorization"].removeprefix("Bearer ") for r in main]
    assert len(main) == 9 and len(set(keys)) == 3 and all(k.startswith("cpk-") for k in keys)
    sec = secret(data)
    store = Store(data / "clawproxy.db")
    try:
        owners = [store.user_by_key_hash(key_hash(sec, k))["name"] for k in keys]
    finally:
        store.close()
    assert owners == ["u1-concise"] * 3 + ["u2-concise"] * 3 + ["u3-bullets"] * 3
    doc = json.loads((tmp_path / "sim" / "curve.json").read_text())
    assert [c["user"] for c in doc["curves"]] == ["u1-concise", "u2-concise", "u3-bullets"]
    assert all([p["interactions"] for p in c["points"]] == [0, 2] for c in doc["curves"])
    summary = {u["user"]: u for u in doc["users"]}
    assert set(summary["u3-bullets"]["cross_talk"]) == {"concise"}
    assert set(summary["u1-concise"]["cross_talk"]["bullets"]["vs_baseline"]) == {"0", "2"}
    assert "other preference's adoption vs baseline" in res.output and "u3-bullets" in res.output


@pytest.mark.parametrize(("args", "message"), [
    (["--share"], "--share goes with --users"),
    (["--users", "concise,pirate", "--data-dir", "d"], "unknown persona 'pirate'"),
    (["--users", "concise", "--persona", "bullets", "--data-dir", "d"], "with --users, name each user's persona"),
    (["--users", "concise"], "needs that system's --data-dir"),
])
def test_simulate_cli_users_errors_are_clear(args, message):
    res = CliRunner().invoke(simulate_cmd, ["--proxy-url", "http://127.0.0.1:9", *args])
    assert res.exit_code == 2 and message in res.output, res.output


def test_simulate_cli_users_refuses_a_trainer_that_cannot_keep_users_apart(tmp_path):
    """The embedded engine serves one adapter for everyone: said before any system starts."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("engine: {kind: embedded, model: smollm2-135m}\ntrainer: {finetune: lora}\n")
    res = CliRunner().invoke(simulate_cmd, ["--config", str(cfg), "--data-dir", str(tmp_path / "d"),
                                            "--users", "concise,bullets"])
    assert res.exit_code == 2 and "engine.kind embedded" in res.output and "trainer.enabled: false" in res.output
    assert not (tmp_path / "d" / "clawproxy.db").exists()  # no users were added
    assert not (tmp_path / "d" / "logs").exists()  # nothing was started
