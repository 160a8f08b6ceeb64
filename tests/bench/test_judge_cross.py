"""bench/judge_cross.py: a cross-encoder fine-tuned on train and compared with the embedding voter on
validation, without reading the held-out split."""

from __future__ import annotations

import json

import numpy as np

from tests.bench.util import bench_module


def test_best_at_fpr_keeps_the_false_positive_bound():
    mod = bench_module("judge_cross")
    y = np.array([2, 2, 0, 0, 1])
    reckless = np.array([2, 2, 2, 0, 1])  # all right but one bad judged good: FPR 1/3
    careful = np.array([2, 1, 0, 0, 1])   # one good left at 0: FPR 0
    best = mod.best_at_fpr([({"name": "reckless"}, reckless), ({"name": "careful"}, careful)], y)
    assert best == {"accuracy": 0.8, "fpr": 0.0, "fnr": 0.0, "name": "careful"}
    p = np.array([[0.1, 0.2, 0.7], [0.45, 0.35, 0.2]])
    assert mod.decide(p, 0.8, 0.5).tolist() == [1, 1] and mod.decide(p, 0.6, 0.4).tolist() == [2, 0]


def test_smoke_run_on_a_slice_never_reads_heldout(tmp_path, monkeypatch):
    import judge.eval.dataset as dataset

    real = dataset.load_cases
    read = []

    def spy(split="heldout"):
        read.append(split)
        return real(split)

    monkeypatch.setattr(dataset, "load_cases", spy)
    out = tmp_path / "cross.json"
    result = bench_module("judge_cross").main(["--limit", "40", "--epochs", "1", "--threads", "1",
                                               "--out", str(out)])
    assert set(read) == {"train", "validation"}
    (row,) = result["epochs"]
    assert row["loss"] > 0 and 0 <= result["embedding_voter"]["accuracy"] <= 1
    assert len(result["embedding_voter"]["other_seeds"]) == 3
    for key in ("cross_alone", "mixed_with_embedding", "agreement"):
        assert row[key]["accuracy"] == 0.0 or row[key]["fpr"] <= 0.05
    assert result["latency"]["ms_per_vote_1_threads"] > 0
    assert json.loads(out.read_text())["epochs"] == result["epochs"]
