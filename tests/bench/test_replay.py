"""bench/replay.py: a recorded run's samples replayed through the trainer from the base model on a
scratch copy of its store, the recorded store left untouched."""

from __future__ import annotations

import json

import yaml

from clawproxy.degenerate import answer_flaw
from clawproxy.simulate.personas import PREFERENCES
from clawproxy.simulate.prompts import HELDOUT_PROMPTS, TRAIN_PROMPTS
from clawproxy.store import Store
from tests.bench.util import bench_module
from tests.trainer.test_loop import _add


def test_replay_trains_a_copy_and_grades_greedy_answers(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "concise-default-120000"
    run_dir.mkdir()
    (run_dir / "run-config.yaml").write_text(yaml.safe_dump({
        "data_dir": str(run_dir),
        "engine": {"model": str(tiny_model_dir)},
        "trainer": {"truncated": "skip", "loss_norm": "token", "batch_size": 2, "learning_rate": 1e-3, "canary_prompts": ["List three colors."],
                    "canary_max_tokens": 8, "threads": 1},
    }))
    store = Store(run_dir / "clawproxy.db")
    _add(store, tiny_model_dir, 4)
    out = tmp_path / "replay.jsonl"

    result = bench_module("replay").main([str(run_dir), "--steps", "2", "--extra", "1", "--max-tokens", "4",
                                          "--set", "trainer.learning_rate=1e-4", "--label", "t", "--out", str(out),
                                          "--sampled", "3", "--sampled-tokens", "4"])

    assert result["persona"] == "concise" and result["overrides"] == {"trainer.learning_rate": 1e-4}
    assert len(result["step_status"]) == 2 and set(result["step_status"]) <= {"published", "gate_failed"}
    answers = list(result["answers"].values())  # 8 held-out prompts + 1 train prompt
    assert list(result["answers"]) == [*HELDOUT_PROMPTS, TRAIN_PROMPTS[0]]
    # the figures are the answers' own: shares over the 9 listed answers, by the persona's check
    assert result["degenerate_share_all"] == sum(answer_flaw(a) is not None for a in answers) / 9
    assert result["preference_rate_all"] == sum(PREFERENCES["concise"].check(a) for a in answers) / 9
    sampled = result["sampled"]  # the first 3 recorded prompts, sampled again from the trained weights
    assert sampled["n"] == 3 and len(sampled["answers"]) == 3 and sampled["max_tokens"] == 4
    # an answer is cut off exactly when it used all 4 tokens (EOS is not counted)
    assert sampled["mean_tokens"] <= 4
    assert (sampled["cut_off_share"] == 1.0) == (sampled["mean_tokens"] == 4)
    assert (sampled["cut_off_share"] == 0.0) <= (sampled["mean_tokens"] < 4)
    assert json.loads(out.read_text().splitlines()[0])["label"] == "t"
    # the recorded run is not touched: nothing trained, no checkpoint written there
    assert store.query("SELECT COUNT(*) AS n FROM trained_samples")[0]["n"] == 0
    assert store.query("SELECT COUNT(*) AS n FROM train_steps")[0]["n"] == 0
    assert not (run_dir / "checkpoints").exists()
