"""The training loop on the tiny model: steps publish real checkpoints, the gate refuses a poisoned
step, LoRA works, a restart resumes without training anything twice, rollback and pruning."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from clawproxy.cli import main
from clawproxy.config import load_config
from clawproxy.store import Store
from tests.trainer.util import insert_turn
from trainer.checkpoints import current_version, rollback
from trainer.cli import collect_stats
from trainer.loop import learning_rate, score_baselines, train_step
from trainer.losses import pack_groups

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def rig(tmp_path, tiny_model_dir):
    """A data dir with a store and a config whose engine model is the tiny model."""

    def make(**trainer):
        overrides = {"data_dir": str(tmp_path / "data"), "engine.model": str(tiny_model_dir),
                     "trainer.batch_size": 2, "trainer.learning_rate": 1e-3,
                     # two short canaries keep the gate real but cheap on a shared 2-core CPU
                     "trainer.canary_prompts": ["What is the capital of France?", "List three colors."],
                     "trainer.canary_max_tokens": 12}
        overrides.update({f"trainer.{k}": v for k, v in trainer.items()})
        cfg = load_config(None, overrides)
        return cfg, Store(cfg.db_path)

    return make


def _prompt(tiny_model_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _add(store, tiny_model_dir, n, seed=0, version=0, hint="Answer in one word."):
    rng = random.Random(seed)
    prompt = _prompt(tiny_model_dir)
    ids = []
    for i in range(n):
        completion = [rng.randrange(100, 5000) for _ in range(8)]
        ids.append(insert_turn(
            store, prompt_ids=prompt, completion_ids=completion, logps=[-10.8] * 8,  # ~ uniform over 49k
            score=1 if i % 2 == 0 else -1, hint=hint if i % 2 == 0 else None,
            weight_version=version, messages=MESSAGES,
        ))
    return ids


def _trainer(cfg, store, engine=None):
    from trainer.loop import Trainer

    return Trainer(cfg, store, engine)


def test_steps_publish_checkpoints_and_restart_trains_nothing_twice(rig, tiny_model_dir):
    cfg, store = rig()
    turns = _add(store, tiny_model_dir, 4)
    insert_turn(store, prompt_ids=[1, 2], completion_ids=[5] * 40, score=1)  # degenerate: skipped
    tr = _trainer(cfg, store)
    results = tr.run()
    assert [r.status for r in results] == ["published", "published"]
    assert [r.new_version for r in results] == [1, 2]
    m = results[0].metrics
    for key in ("loss", "adv_mean", "clip_frac", "kl", "grad_norm", "tokens_per_s", "samples", "skipped"):
        assert key in m
    assert m["skipped"] == {"degenerate": 1} and results[1].metrics["skipped"] == {}
    assert m["opd_samples"] == 1 and m["gate"]["ok"]

    v1 = cfg.data_path / "checkpoints" / "v1"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in v1.iterdir()}
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    new = load_file(str(v1 / "model.safetensors"))
    changed = [k for k in base if not torch.equal(base[k], new[k])]
    assert len(changed) == len(base)  # every tensor moved
    assert not list((cfg.data_path / "checkpoints").glob(".tmp-*"))

    rows = store.query("SELECT turn_id FROM trained_samples ORDER BY turn_id")
    assert [r["turn_id"] for r in rows] == turns
    steps = store.query("SELECT status, base_version, new_version, metrics FROM train_steps ORDER BY id")
    assert [(s["base_version"], s["new_version"]) for s in steps] == [(0, 1), (1, 2)]

    # "crash" and restart: resumes from v2's weights, finds nothing new to train
    tr2 = _trainer(cfg, store)
    assert tr2.current.version == 2
    v2 = load_file(str(cfg.data_path / "checkpoints" / "v2" / "model.safetensors"))
    torch.testing.assert_close(tr2.policy.model.state_dict()["model.embed_tokens.weight"], v2["model.embed_tokens.weight"])
    assert tr2.run() == []
    more = _add(store, tiny_model_dir, 2, seed=1, version=2)
    assert [r.new_version for r in tr2.run()] == [3]
    rows = store.query("SELECT turn_id, COUNT(*) AS n FROM trained_samples GROUP BY turn_id")
    assert sorted(r["turn_id"] for r in rows) == sorted(turns + more) and all(r["n"] == 1 for r in rows)


def test_poisoned_step_is_refused_and_nothing_published(rig, tiny_model_dir):
    cfg, store = rig()
    _add(store, tiny_model_dir, 2)
    tr = _trainer(cfg, store)
    with torch.no_grad():  # a NaN in the weights makes the loss and gradients NaN
        tr.policy.model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    (result,) = tr.run(steps=1)
    assert result.status == "gate_failed" and result.new_version is None
    assert {"loss_finite", "grad_finite", "weights_finite"} <= set(result.metrics["gate"]["failed"])
    assert not (cfg.data_path / "checkpoints" / "v1").exists()
    assert store.query("SELECT * FROM checkpoints") == []
    assert store.query_one("SELECT status FROM train_steps")["status"] == "gate_failed"
    ev = store.query("SELECT kind, data FROM events WHERE kind='gate_failed'")
    assert len(ev) == 1 and "weights_finite" in ev[0]["data"]["failed"]
    # back on the last published (base) weights, finite, and the next batch publishes
    assert all(torch.isfinite(p).all() for p in tr.policy.model.parameters())
    assert result.metrics["lr"] == pytest.approx(1e-3)
    _add(store, tiny_model_dir, 2, seed=5)
    (ok,) = tr.run(steps=1)
    assert ok.status == "published" and ok.new_version == 1
    assert ok.metrics["lr"] == pytest.approx(5e-4)  # backed off after the refusal ...
    _add(store, tiny_model_dir, 2, seed=6, version=1)
    (again,) = tr.run(steps=1)
    assert again.metrics["lr"] == pytest.approx(1e-3)  # ... and back to full once one published
    s = collect_stats(store)
    assert s["gate_failures"][0]["failed"] and s["versions"][0]["steps_gate_failed"] == 1


def test_refusals_in_a_row_back_off_the_learning_rate_down_to_an_eighth(rig, tiny_model_dir):
    cfg, store = rig(learning_rate=1.0, gate_max_kl=0.0)  # every step diverges
    _add(store, tiny_model_dir, 10)
    tr = _trainer(cfg, store)
    results = tr.run(steps=5)
    assert [r.status for r in results] == ["gate_failed"] * 5
    assert [r.metrics["lr"] for r in results] == [1.0, 0.5, 0.25, 0.125, 0.125]
    assert learning_rate(store, cfg.trainer, 0) == 0.125  # read from the store: a restart keeps it
    assert learning_rate(store, cfg.trainer, 1) == 1.0  # refusals from another version do not count


def test_divergence_gate_refuses_a_huge_step(rig, tiny_model_dir):
    cfg, store = rig(learning_rate=1.0, gate_max_kl=0.01)
    _add(store, tiny_model_dir, 2)
    (result,) = _trainer(cfg, store).run(steps=1)
    assert result.status == "gate_failed" and "divergence" in result.metrics["gate"]["failed"]


def test_a_full_disk_keeps_the_samples_and_the_served_weights(rig, tiny_model_dir, monkeypatch):
    import errno

    from trainer.publishing import Publisher

    cfg, store = rig()
    turns = _add(store, tiny_model_dir, 2)
    tr = _trainer(cfg, store)
    before = tr.policy.model.state_dict()["model.embed_tokens.weight"].clone()
    real_save = Publisher.save

    def full_disk(self, tmp, state_dict):
        (tmp / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Publisher, "save", full_disk)
    (result,) = tr.run(steps=1)
    assert result.status == "error" and result.metrics["save_error"] == "No space left on device"
    assert not (cfg.data_path / "checkpoints").exists() or not list((cfg.data_path / "checkpoints").iterdir())
    assert store.query("SELECT * FROM trained_samples") == [] and store.query("SELECT * FROM checkpoints") == []
    assert store.query_one("SELECT kind FROM events WHERE kind='checkpoint_write_failed'")
    torch.testing.assert_close(tr.policy.model.state_dict()["model.embed_tokens.weight"], before)  # restored

    monkeypatch.setattr(Publisher, "save", real_save)  # space freed: the same samples train
    (ok,) = tr.run(steps=1)
    assert ok.status == "published" and ok.new_version == 1
    assert sorted(r["turn_id"] for r in store.query("SELECT turn_id FROM trained_samples")) == turns


def test_lora_trains_only_the_adapter_and_publishes_it(rig, tiny_model_dir):
    cfg, store = rig(finetune="lora", teacher="ema", learning_rate=1e-2)
    _add(store, tiny_model_dir, 4)
    tr = _trainer(cfg, store)
    before = {n: p.detach().clone() for n, p in tr.policy.model.named_parameters()}
    results = tr.run()
    assert [r.status for r in results] == ["published", "published"]
    after = dict(tr.policy.model.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and all("lora_" in n for n in moved)  # the base weights never move
    assert any(".default." in n for n in moved)  # trained adapter
    assert any(".teacher." in n for n in moved)  # EMA teacher adapter (TRL's PEFTAdapterEMACallback)
    v2 = cfg.data_path / "checkpoints" / "v2"
    assert {"adapter_model.safetensors", "adapter_config.json"} <= {p.name for p in v2.iterdir()}
    assert store.query_one("SELECT kind FROM checkpoints WHERE version=2")["kind"] == "lora"
    # restart loads the adapter back
    tr2 = _trainer(cfg, store)
    lora_b = [n for n in moved if "lora_B.default" in n][0]
    torch.testing.assert_close(dict(tr2.policy.model.named_parameters())[lora_b], after[lora_b])


def test_rollback_prune_and_cli(rig, tiny_model_dir, tmp_path):
    cfg, store = rig(keep_checkpoints=1)
    _add(store, tiny_model_dir, 4)
    tr = _trainer(cfg, store)
    assert [r.new_version for r in tr.run()] == [1, 2]
    ck = cfg.data_path / "checkpoints"
    assert not (ck / "v1").exists() and (ck / "v2").exists()
    assert store.query_one("SELECT status FROM checkpoints WHERE version=1")["status"] == "deleted"

    new, source = rollback(store, None, tiny_model_dir)  # default: the previous version still on disk
    assert (new, source.version) == (3, 0)
    cur = current_version(store, tiny_model_dir)
    assert cur.version == 3 and cur.path == tiny_model_dir
    tr.collect()  # a running trainer follows the rollback
    assert tr.current.version == 3
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    torch.testing.assert_close(tr.policy.model.state_dict()["model.norm.weight"], base["model.norm.weight"])

    config_file = tmp_path / "cfg.yaml"
    config_file.write_text(
        f"engine:\n  model: {tiny_model_dir}\ntrainer:\n  batch_size: 2\n  canary_max_tokens: 12\n"
        "  keep_checkpoints: 1\n"
    )
    runner = CliRunner()
    res = runner.invoke(main, ["rollback", "1", "--data-dir", str(cfg.data_path), "--config", str(config_file), "--no-engine"])
    assert res.exit_code != 0 and "deleted" in res.output
    res = runner.invoke(main, ["stats", "--json", "--data-dir", str(cfg.data_path), "--config", str(config_file)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["current_version"] == 3 and data["rollbacks"][0]["to"] == 0
    by_v = {v["version"]: v for v in data["versions"]}
    assert by_v[1]["samples_trained"] == 2 and by_v[3]["source"] == "rollback to v0"
    assert by_v[0]["served_turns"] == 4 and by_v[0]["mean_score"] == 0.0
    png = tmp_path / "stats.png"
    res = runner.invoke(main, ["stats", "--data-dir", str(cfg.data_path), "--config", str(config_file),
                               "--plot", str(png)])
    assert res.exit_code == 0 and "v2 -> weights of v0 as v3" in res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    _add(store, tiny_model_dir, 2, seed=3, version=3)
    res = runner.invoke(main, ["train", "--steps", "1", "--data-dir", str(cfg.data_path), "--config", str(config_file)])
    assert res.exit_code == 0, res.output
    assert "v3 -> v4" in res.output
    # v3 (the rollback to v0) was pruned: its row points at the base model, which must stay
    assert store.query_one("SELECT status FROM checkpoints WHERE version=3")["status"] == "deleted"
    assert (tiny_model_dir / "model.safetensors").exists()


def test_rollback_while_a_step_trains_wins(rig, tiny_model_dir, monkeypatch):
    """A step trained from v2 must not publish over a rollback made while it trained: it is
    recorded as superseded, its samples stay untrained, and the trainer follows the rollback."""
    import trainer.loop

    cfg, store = rig()
    _add(store, tiny_model_dir, 4)
    tr = _trainer(cfg, store)
    assert [r.new_version for r in tr.run(steps=1)] == [1]
    batch = tr.collect()
    assert len(batch.samples) == 2
    real_step = trainer.loop.train_step

    def step_then_rollback(*a, **kw):
        out = real_step(*a, **kw)
        rollback(store, None, tiny_model_dir, 0)  # `clawproxy rollback 0` from another shell
        return out

    monkeypatch.setattr(trainer.loop, "train_step", step_then_rollback)
    result = tr.step(batch)
    assert result.status == "superseded" and result.new_version is None
    assert current_version(store, tiny_model_dir).version == 2  # the rollback's version, not a v3
    assert not (cfg.data_path / "checkpoints" / "v3").exists()
    trained = {r["turn_id"] for r in store.query("SELECT turn_id FROM trained_samples")}
    assert not trained & {s.turn_id for s in batch.samples}
    monkeypatch.setattr(trainer.loop, "train_step", real_step)
    tr.collect()
    assert tr.current.version == 2
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    torch.testing.assert_close(tr.policy.model.state_dict()["model.norm.weight"], base["model.norm.weight"])
    assert [r.new_version for r in tr.run(steps=1)] == [3]  # the samples train again, from v2


def test_a_packed_step_publishes_the_weights_of_an_unpacked_one(rig, tiny_model_dir, tmp_path):
    """Four samples on one prompt (two with a hint, so the teacher pass packs too): one packed pass
    forwards the prompt once, and the step's loss and published weights are the unpacked step's."""
    results = {}
    for pack in (True, False):
        cfg, store = rig(batch_size=4, pack_prefixes=pack)
        cfg = replace(cfg, data_dir=tmp_path / f"pack-{pack}")
        store = Store(cfg.db_path)
        _add(store, tiny_model_dir, 4)
        [results[pack]] = _trainer(cfg, store).run(steps=1)
        results[pack].weights = load_file(str(cfg.data_dir / "checkpoints" / "v1" / "model.safetensors"))
    packed, unpacked = results[True], results[False]
    assert packed.status == unpacked.status == "published"
    assert (packed.metrics["passes"], unpacked.metrics["passes"]) == (1, 4)
    prompt_len = len(_prompt(tiny_model_dir))
    assert packed.metrics["tokens"] == unpacked.metrics["tokens"] == unpacked.metrics["forwarded_tokens"]
    assert packed.metrics["forwarded_tokens"] == unpacked.metrics["tokens"] - 3 * prompt_len
    assert packed.metrics["opd_samples"] == 2
    assert packed.metrics["loss"] == pytest.approx(unpacked.metrics["loss"], abs=1e-5)
    for k, w in unpacked.weights.items():  # Adam moves each weight ~lr (1e-3): a wrong pass shows
        torch.testing.assert_close(packed.weights[k], w, atol=1e-5, rtol=1e-4)


def test_pack_groups_fill_passes_up_to_the_budget_in_order():
    system = list(range(100, 150))
    seqs = [system + [1, 2], system + [3], system + [4, 5, 6], list(range(200, 300)), system + [7]]
    assert pack_groups(seqs, 56) == [[0, 1, 2], [3], [4]]  # 52 + 1 + 3 tokens; then one over the budget alone
    assert pack_groups(seqs, 1000) == [[0, 1, 2, 3, 4]]
    assert pack_groups(seqs, 1) == [[0], [1], [2], [3], [4]]


def test_two_processes_make_the_same_step_as_one(rig, tiny_model_dir, tmp_path):
    """accelerate data parallel (2 CPU processes, gloo, launched by torchrun): the batch is broadcast,
    split unevenly (3 samples), gradients averaged; the published weights equal one process's."""
    import os
    import subprocess
    import sys

    from tests.net import held_port

    config_file = tmp_path / "cfg.yaml"
    # kind named: the second run is a subprocess, which the conftest's engine.kind pin does not reach
    config_file.write_text(f"engine:\n  kind: vllm\n  model: {tiny_model_dir}\ntrainer:\n  batch_size: 3\n  threads: 1\n"
                           "  learning_rate: 0.001\n  canary_max_tokens: 8\n")
    dirs = {}
    for name in ("one", "two"):
        d = tmp_path / name
        store = Store(d / "clawproxy.db")
        _add(store, tiny_model_dir, 3)
        store.close()
        dirs[name] = d
    args = ["train", "--steps", "1", "--config", str(config_file)]
    res = CliRunner().invoke(main, [*args, "--data-dir", str(dirs["one"])])
    assert res.exit_code == 0, res.output
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    with held_port() as master_port:
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(master_port),
             "-m", "clawproxy.cli", *args, "--data-dir", str(dirs["two"])],
            env=env, capture_output=True, text=True, timeout=300,
        )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("v0 -> v1") == 1  # only the main process reports
    one = load_file(str(dirs["one"] / "checkpoints" / "v1" / "model.safetensors"))
    two = load_file(str(dirs["two"] / "checkpoints" / "v1" / "model.safetensors"))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=1e-6, rtol=1e-5)
    assert not torch.equal(one["model.norm.weight"], base["model.norm.weight"])
    store = Store(dirs["two"] / "clawproxy.db")
    assert store.query_one("SELECT COUNT(*) AS n FROM trained_samples")["n"] == 3


def test_score_baselines_leave_one_out(rig, tiny_model_dir):
    """RLOO over this batch and the samples trained before it (newest first, score-0 left out);
    window 0 gives 0."""
    from trainer.batch import Sample

    def sample(turn_id, score):
        return Sample(turn_id=turn_id, prompt_ids=[1], completion_ids=[2], behaviour_logps=[-1.0], score=score,
                      hint=None, weight_version=0, tools_as_text=False)

    cfg, store = rig(baseline_window=4)
    tcfg = cfg.trainer
    # no history: each sample against the others in its batch; all-fail batch -> advantage 0
    assert score_baselines(store, tcfg, [sample(1, -1), sample(2, -1)]) == {1: -1.0, 2: -1.0}
    assert score_baselines(store, tcfg, [sample(1, 1), sample(2, -1), sample(3, 0)]) == {1: -1.0, 2: 1.0, 3: 0.0}
    assert score_baselines(store, tcfg, [sample(1, 1)]) == {1: 0.0}
    distilled = sample(4, -1)
    distilled.objective = "opd"  # a cut-off answer trained by distillation alone: its -1 is no RL score
    assert score_baselines(store, tcfg, [sample(1, 1), distilled]) == {1: 0.0, 4: 1.0}
    old = [insert_turn(store, prompt_ids=[1], completion_ids=[2], score=s) for s in (1, 1, -1, -1, -1, 0)]
    step = store.insert("train_steps", {"created_at": 0.0, "method": "rl", "status": "published"})
    for t in old:
        store.insert("trained_samples", {"turn_id": t, "step_id": step})
    # history: the newest four non-zero are -1, -1, -1, +1; pool with the batch sums to -2 over 6
    assert score_baselines(store, tcfg, [sample(7, 1), sample(8, -1)]) == pytest.approx({7: -0.6, 8: -0.2})
    tcfg = rig(baseline_window=0)[0].trainer
    assert score_baselines(store, tcfg, [sample(7, 1)]) == {7: 0.0}


def test_a_cut_off_answer_with_a_hint_trains_by_distillation_alone(rig, tiny_model_dir):
    """Its loss is the OPD term only: the same answer scored -1 or +1 gives the same loss, and the
    same answer finished (not cut off) does not. It moves the weights, is recorded as objective 'opd',
    and its score stays out of the RL baseline."""
    cfg, store = rig()
    prompt = _prompt(tiny_model_dir)
    rng = random.Random(3)
    completion = [rng.randrange(100, 5000) for _ in range(8)]
    tr = _trainer(cfg, store)

    def loss(score, finish_reason):
        t = insert_turn(store, prompt_ids=prompt, completion_ids=completion, logps=[-10.8] * 8, score=score,
                        hint="Answer in one word.", messages=MESSAGES, finish_reason=finish_reason)
        batch = tr.collect()
        (s,) = [s for s in batch.samples if s.turn_id == t]
        # learning rate 0: the loss is measured, the weights stay for the next comparison
        m = train_step(tr.policy, tr.optimizer, replace(batch, samples=[s], baselines={}, lr=0.0), cfg.trainer)
        store.record_skipped({t: "test"})  # out of the next collect
        return s.objective, m

    (k_neg, cut_neg), (k_pos, cut_pos) = loss(-1, "length"), loss(1, "length")
    k_fin, fin = loss(-1, "stop")
    assert (k_neg, k_pos, k_fin) == ("opd", "opd", "rl_opd")
    assert cut_neg.loss == pytest.approx(cut_pos.loss) and cut_neg.opd_samples == 1
    assert abs(fin.loss - cut_neg.loss) > 0.1  # the finished one carries the RL term (-1 x 8 tokens)

    cut = insert_turn(store, prompt_ids=prompt, completion_ids=completion, logps=[-10.8] * 8, score=-1,
                      hint="Answer in one word.", messages=MESSAGES, finish_reason="length")
    plain = _add(store, tiny_model_dir, 1, seed=4, hint=None)
    before = {k: v.detach().clone() for k, v in tr.policy.model.state_dict().items()}
    (result,) = tr.run(steps=1)
    assert result.status == "published" and result.metrics["kinds"] == {"opd": 1, "rl": 1}
    assert any(not torch.equal(before[k], v) for k, v in tr.policy.model.state_dict().items())
    rows = store.query("SELECT turn_id, kind FROM trained_samples ORDER BY turn_id")
    assert rows == [{"turn_id": cut, "kind": "opd"}, {"turn_id": plain[0], "kind": "rl"}]
    assert store.recent_trained_scores(10) == [1]  # the cut-off answer's -1 is not an RL score
    assert store.trained_objective(cut) == "opd" and store.trained_by_objective() == {"opd": 1, "rl": 1}


def test_a_sample_whose_teacher_prompt_is_too_long_is_skipped_with_its_reason(rig, tiny_model_dir):
    """The student's prompt fits max_seq_len, the hint pushes the teacher's past it: skipped and
    recorded, never trained and never a crash; the sample without a hint is kept."""
    n = len(_prompt(tiny_model_dir)) + 8
    cfg, store = rig(max_seq_len=n + 2)  # the hint adds more than 2 tokens
    hinted, plain = _add(store, tiny_model_dir, 2)
    tr = _trainer(cfg, store)
    assert [s.turn_id for s in tr.collect().samples] == [plain]
    rows = store.query("SELECT turn_id, reason FROM skipped_samples")
    assert rows == [{"turn_id": hinted, "reason": "teacher_too_long"}]


def test_step_metrics_are_summed_over_processes_in_one_collective():
    """Under data parallel each process sums its micro-batches; one all-reduce adds the sums, and
    what is not a sum (the batch's size, the learning rate) is left alone."""
    from trainer.loop import StepMetrics

    class TwoRanks:  # the piece of accelerate.Accelerator that StepMetrics.reduce uses
        num_processes, device, calls = 2, "cpu", 0

        def reduce(self, tensor, reduction):
            assert reduction == "sum"
            self.calls += 1
            return tensor * 2  # the other rank holds the same sums

    m = StepMetrics(loss=0.5, tokens=40, completion_tokens=10, clip_sum=1.0, opd_tokens=4, opd_gap_sum=2.0,
                    samples=3, lr=0.1, objectives={"rl": 3})
    acc = TwoRanks()
    m.reduce(acc)
    assert acc.calls == 1
    d = m.as_dict()
    assert (d["loss"], d["tokens"], d["completion_tokens"]) == (1.0, 80, 20)
    assert d["clip_frac"] == pytest.approx(0.1) and d["opd_gap_mean"] == pytest.approx(0.5)
    assert (d["samples"], d["lr"], d["kinds"]) == (3, 0.1, {"rl": 3})
    assert "gate" not in d and "save_s" not in d  # set by the gate and the publish, not yet here


def test_an_active_preference_is_distilled_and_its_gap_decides_when_the_prompt_goes(rig, tiny_model_dir):
    """A user's active preference is every sample's teacher context; a turn served under it trains
    the student on the prompt without it; after a published step the preference holds the batch's
    gap, and two small gaps in a row mark it absorbed (the proxy then drops the prompt)."""
    from transformers import AutoTokenizer

    from clawproxy.instruct import add_hint

    cfg, store = rig()
    pref = "Answer in one word."
    pid = store.add_preference(None, pref, "manual", status="active")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    served = tok.apply_chat_template(add_hint(MESSAGES, pref), add_generation_prompt=True, tokenize=True)
    served = list(served["input_ids"] if hasattr(served, "keys") else served)
    tried = insert_turn(store, prompt_ids=served, completion_ids=[11, 12, 13], logps=[-2.0] * 3, score=1,
                        messages=MESSAGES)
    store.update("turns", "id", tried, {"instruction": pref, "instruction_role": "apply", "applied_ids": [pid]})
    (plain,) = _add(store, tiny_model_dir, 1, seed=5, hint=None)
    tr = _trainer(cfg, store)
    batch = tr.collect()
    by_id = {s.turn_id: s for s in batch.samples}
    assert set(by_id) == {tried, plain} and all(s.hint == pref for s in by_id.values())
    assert by_id[tried].prompt_ids == _prompt(tiny_model_dir) != served  # the student never sees it
    (result,) = tr.run(steps=1)
    assert result.status == "published" and result.metrics["opd_samples"] == 2
    row = store.preference(pid)
    assert row["gap"] == pytest.approx(abs(result.metrics["opd_gap_mean"])) and not row["absorbed"]
    cfg.trying.absorb_gap = 1e9  # any gap is small: the second step in a row absorbs it
    store.set_preference_gap(pid, 0.0, absorbed=False)
    _add(store, tiny_model_dir, 2, seed=6, hint=None)
    (result,) = tr.run(steps=1)
    assert result.status == "published" and store.preference(pid)["absorbed"] == 1


def test_under_lora_a_preference_is_taught_by_the_base_model_and_a_judge_hint_by_the_policy(rig, tiny_model_dir):
    """With the policy as teacher, an adapter that already follows "shorter" would be told "shorter"
    again at every step; the base model told the preference is a target that does not move."""
    from dataclasses import replace as with_fields

    from trl.trainer.utils import use_adapter

    from trainer.batch import teacher_prompt_ids
    from trainer.loop import teacher_logps
    from trainer.losses import completion_logps, make_token_batch
    from trainer.policy import unwrap

    cfg, store = rig(finetune="lora", learning_rate=1e-2)  # trainer.teacher: current
    _add(store, tiny_model_dir, 4)
    tr = _trainer(cfg, store)
    (result,) = tr.run(steps=1)  # the adapter is no longer zero
    assert result.status == "published"
    policy, tok = tr.policy, tr.policy.tokenizer
    hinted = next(s for s in tr.collect().samples if s.hint)
    chunk = [with_fields(hinted, distilled=False), with_fields(hinted, distilled=True)]
    tokens = make_token_batch([s.prompt_ids for s in chunk], [s.completion_ids for s in chunk], tok.pad_token_id)
    got, has = teacher_logps(policy, chunk, tokens, "combined")
    assert has.tolist() == [True, True]
    told = make_token_batch([teacher_prompt_ids(tok, hinted)], [hinted.completion_ids], tok.pad_token_id)
    with torch.no_grad():
        own = completion_logps(policy.model, told)[0]
        with use_adapter(unwrap(policy.model), None):
            base = completion_logps(policy.model, told)[0]
    n = len(hinted.completion_ids)
    assert not torch.allclose(own[:n], base[:n])  # the adapter moved: the two teachers differ
    torch.testing.assert_close(got[0, :n], own[:n])
    torch.testing.assert_close(got[1, :n], base[:n])


def test_a_refused_step_keeps_the_serving_versions_canaries_and_times_the_gate(rig, tiny_model_dir, monkeypatch):
    """The gate's reference answers are generated once per version: a refused step does not make the
    next one generate them again (on a CPU without bfloat16 that generation is most of the gate)."""
    from trainer import gate

    calls = []
    real = gate.canary_reference
    monkeypatch.setattr(gate, "canary_reference", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    cfg, store = rig(gate_max_kl=0.0)  # every step diverges "too far": refused
    _add(store, tiny_model_dir, 4)
    tr = _trainer(cfg, store)
    results = tr.run(steps=2)
    assert [r.status for r in results] == ["gate_failed", "gate_failed"]
    assert calls == [0]  # v0's answers once; each step's new answers are drafted by them (gate.verify_and_extend)
    assert all(r.metrics["gate_s"] > 0 for r in results)
    assert results[0].metrics["canary_s"] > 0 and results[1].metrics["canary_s"] < results[0].metrics["canary_s"]


def test_a_turn_served_under_an_instruction_is_learned_as_a_teachers_answer(rig, tiny_model_dir):
    """Its answer was sampled by the instructed model (recorded log-probs near 0) and is unlikely
    under the student: the step takes its ratio as 1 and pushes those tokens up at full strength.
    The same sample as the student's own stays importance-weighted (ratio ~ e^-10, no push)."""
    cfg, store = rig()
    tr = _trainer(cfg, store)
    _add(store, tiny_model_dir, 1, seed=8, hint=None)
    (s,) = tr.collect().samples
    sure = replace(s, behaviour_logps=[0.0] * len(s.completion_ids), hint=None)
    batch = tr.collect()

    def grad_norm(sample):
        return train_step(tr.policy, tr.optimizer, replace(batch, samples=[sample], baselines={}, lr=0.0),
                          cfg.trainer).grad_norm

    own, taught = grad_norm(sure), grad_norm(replace(sure, served_instruction="Answer in one word."))
    assert sure.score == 1 and taught > 1000 * own > 0
