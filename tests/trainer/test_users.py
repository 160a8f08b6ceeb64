"""Users on the tiny model: each step trains one owner's adapter on that owner's turns alone; an
opted-out user's adapter starts fresh, a sharer's from the shared one; rollback moves one chain."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from clawproxy.config import load_config
from clawproxy.errors import ConfigError
from clawproxy.store import Store
from tests.trainer.util import insert_turn
from tests.waits import until_sync
from trainer.checkpoints import current_version, rollback

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def _rig(tmp_path: Path, model: Path, **trainer):
    overrides = {"data_dir": str(tmp_path / "data"), "engine.model": str(model),
                 "trainer.batch_size": 2, "trainer.learning_rate": 1e-3, "trainer.finetune": "lora",
                 "trainer.canary_prompts": ["What is the capital of France?"], "trainer.canary_max_tokens": 8}
    overrides.update({f"trainer.{k}": v for k, v in trainer.items()})
    cfg = load_config(None, overrides)
    return cfg, Store(cfg.db_path)


def _add(store: Store, model: Path, user: str | None, n: int, seed: int) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    rng = random.Random(seed)
    return [insert_turn(store, prompt_ids=prompt, completion_ids=[rng.randrange(100, 5000) for _ in range(8)],
                        logps=[-10.8] * 8, score=1 if i % 2 == 0 else -1, hint=None, messages=MESSAGES,
                        user=user) for i in range(n)]


def test_each_step_trains_one_owner_on_their_turns_from_the_right_weights(tmp_path, tiny_model_dir, monkeypatch):
    import trainer.loop
    from trainer.loop import Trainer

    cfg, store = _rig(tmp_path, tiny_model_dir)
    store.add_user("alice", None)
    store.add_user("bob", None)
    store.add_user("carol", None, shared=True)
    owner_of = {t: "carol" for t in _add(store, tiny_model_dir, "carol", 2, seed=1)}
    owner_of |= {t: "alice" for t in _add(store, tiny_model_dir, "alice", 2, seed=2)}
    owner_of |= {t: "bob" for t in _add(store, tiny_model_dir, "bob", 2, seed=3)}

    tr = Trainer(cfg, store)
    starts: list[tuple[str | None, int, dict[str, torch.Tensor], int]] = []  # owner, base, weights, Adam state
    real_step = trainer.loop.train_step

    def spy(policy, optimizer, batch, tcfg):
        inner = getattr(optimizer, "optimizer", optimizer)
        starts.append((batch.owner, tr.current.version, tr.adapter_weights(), len(inner.state)))
        return real_step(policy, optimizer, batch, tcfg)

    monkeypatch.setattr(trainer.loop, "train_step", spy)
    results = tr.run()
    assert [r.status for r in results] == ["published"] * 4
    # oldest ready sample first: the shared adapter and carol both wait on carol's turn 1
    assert [s[0] for s in starts] == [None, "carol", "alice", "bob"]

    steps = store.query("SELECT id, user, new_version FROM train_steps ORDER BY id")
    for step in steps:
        turns = {r["turn_id"] for r in store.query("SELECT turn_id FROM trained_samples WHERE step_id=?", (step["id"],))}
        assert len(turns) == 2
        if step["user"] is None:  # the shared adapter: only turns of users who share
            assert {owner_of[t] for t in turns} == {"carol"}
        else:
            assert {owner_of[t] for t in turns} == {step["user"]}
    ckpt = {r["user"]: r for r in store.query("SELECT version, path, user FROM checkpoints")}
    assert set(ckpt) == {None, "alice", "bob", "carol"}
    assert current_version(store, tiny_model_dir, "alice").version == ckpt["alice"]["version"]

    shared = load_file(str(Path(ckpt[None]["path"]) / "adapter_model.safetensors"))
    by_owner = {o: (base, w, adam) for o, base, w, adam in starts}
    base, carol_start, adam = by_owner["carol"]
    assert base == ckpt[None]["version"] and adam == 0  # a sharer starts from the shared adapter, fresh moments
    assert carol_start.keys() == shared.keys()
    for k in shared:
        torch.testing.assert_close(carol_start[k], shared[k].to(carol_start[k].dtype))
    for who in ("alice", "bob"):  # opted out: a fresh LoRA, nothing trained on anyone else's turns
        base, start, adam = by_owner[who]
        assert base == 0 and adam == 0
        assert all(torch.equal(start[k], tr.held.fresh[k]) for k in tr.held.fresh)
        assert any(not torch.equal(start[k], shared[k].to(start[k].dtype)) for k in shared)

    # rollback moves only the named owner's chain
    new, source = rollback(store, None, tiny_model_dir, owner="alice")
    assert source.version == 0 and store.checkpoint(new)["user"] == "alice"
    assert current_version(store, tiny_model_dir, "alice").version == new
    assert current_version(store, tiny_model_dir).version == ckpt[None]["version"]
    with pytest.raises(ConfigError, match="not a version of the shared adapter"):
        rollback(store, None, tiny_model_dir, ckpt["bob"]["version"])


def test_stale_is_counted_on_the_owners_chain(tmp_path, tiny_model_dir):
    """Versions published for other owners do not age a user's turns."""
    cfg, store = _rig(tmp_path, tiny_model_dir)
    store.add_user("alice", None)
    for v, user in enumerate([None, None, None, "alice", None, None], start=1):
        store.insert("checkpoints", {"version": v, "path": f"/x/v{v}", "kind": "lora", "created_at": 0.0,
                                     "status": "published", "user": user})
    assert store.stale_below(None, 1) == 5  # the shared chain 1 2 3 5 6: two back from 6
    assert store.stale_below("alice", 0) == 4
    assert store.stale_below("alice", 1) == 0  # her chain has one version: nothing is stale yet
    store.set_shared("alice", True)
    assert store.stale_below("alice", 1) == 3  # a sharer was served the shared 1 2 3 before her own 4


def test_users_need_lora(tmp_path, tiny_model_dir):
    from trainer.loop import Trainer

    cfg, store = _rig(tmp_path, tiny_model_dir, finetune="full")
    store.add_user("alice", None)
    with pytest.raises(ConfigError, match="finetune: lora"):
        Trainer(cfg, store)


def test_a_user_removed_while_their_step_trains_leaves_nothing_behind(tmp_path, tiny_model_dir, monkeypatch):
    """`users remove` during a step: the step keeps no row, file or moments of theirs; the next
    owner trains from their own weights."""
    import trainer.loop
    from trainer.loop import Trainer

    cfg, store = _rig(tmp_path, tiny_model_dir)
    store.add_user("alice", None)
    store.add_user("bob", None)
    _add(store, tiny_model_dir, "alice", 2, seed=1)
    bob_turns = set(_add(store, tiny_model_dir, "bob", 2, seed=2))
    tr = Trainer(cfg, store)
    real_step = trainer.loop.train_step
    starts: list[tuple[str | None, int, dict[str, torch.Tensor], int]] = []

    def remove_alice_mid_step(policy, optimizer, batch, tcfg):
        inner = getattr(optimizer, "optimizer", optimizer)
        starts.append((batch.owner, tr.current.version, tr.adapter_weights(), len(inner.state)))
        m = real_step(policy, optimizer, batch, tcfg)
        if batch.owner == "alice":
            store.remove_user("alice")  # what `clawproxy users remove alice` does to the store
        return m

    monkeypatch.setattr(trainer.loop, "train_step", remove_alice_mid_step)
    results = tr.run()
    assert [r.status for r in results] == ["user_removed", "published"]
    assert [s[0] for s in starts] == ["alice", "bob"]
    owner, base, start, adam = starts[1]
    assert base == 0 and adam == 0 and all(torch.equal(start[k], tr.held.fresh[k]) for k in tr.held.fresh)

    steps = store.query("SELECT id, user FROM train_steps")
    assert [s["user"] for s in steps] == ["bob"]
    assert {r["turn_id"] for r in store.query("SELECT turn_id FROM trained_samples")} == bob_turns
    ckpts = store.query("SELECT version, path, user FROM checkpoints")
    assert [c["user"] for c in ckpts] == ["bob"]
    assert sorted(p.name for p in tr.ckpt_root.iterdir()) == [Path(ckpts[0]["path"]).name]
    assert "alice" not in tr.held.moments


def test_users_remove_waits_for_a_publish_in_flight(tmp_path):
    """The CLI takes the publish lock, so a step publishing for that user finishes first."""
    import threading

    from click.testing import CliRunner

    from clawproxy.cli import main

    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    store = Store(data / "clawproxy.db")
    store.add_user("alice", None)
    held, done = threading.Event(), threading.Event()
    lock_file = store.path.with_name(store.path.name + ".publish.lock")

    def someone_waits_for(path: Path) -> bool:
        """The kernel lists a process blocked on ``path``'s flock ("->" lines of /proc/locks)."""
        inode = str(path.stat().st_ino)
        return any(f[1] == "->" and f[2] == "FLOCK" and f[6].rsplit(":", 1)[-1] == inode
                   for f in (line.split() for line in Path("/proc/locks").read_text().splitlines())
                   if len(f) > 6)

    def publish():
        with store.publish_lock():
            held.set()
            # the CLI reaches the lock and blocks on it (or never does)
            until_sync(lambda: someone_waits_for(lock_file), "the CLI to block on the publish lock")
            done.set()

    t = threading.Thread(target=publish)
    t.start()
    held.wait(5)
    r = CliRunner().invoke(main, ["users", "remove", "alice", "--yes", "--data-dir", str(data)])
    finished_first = done.is_set()  # without the lock the CLI returns while the publish still holds it
    t.join(5)
    assert r.exit_code == 0, r.output
    assert finished_first and store.get_user("alice") is None
