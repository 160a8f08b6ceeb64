"""bench/judge_abstain.py: confidences for the embedding voter's abstention, compared on validation
over head seeds, without reading the held-out split."""

from __future__ import annotations

import numpy as np
import pytest

from judge.extract import JudgeInput
from tests.bench.util import bench_module


def _inp(next_state: str, response: str = "Lima.", request: str = "capital of Peru?") -> JudgeInput:
    return JudgeInput(request=request, response=response, next_state=next_state, role="user")


def _unit(*v: float) -> np.ndarray:
    a = np.array(v, dtype=np.float32)
    return a / np.linalg.norm(a)


def test_neighbour_shares_count_the_labels_of_the_k_most_similar_replies():
    mod = bench_module("judge_abstain")
    train = np.stack([_unit(1, 0), _unit(1, 0.1), _unit(1, 0.2), _unit(0, 1), _unit(0.1, 1)])
    labels = np.array([0, 0, 2, 2, 1])
    shares = mod.neighbour_shares(train, labels, np.stack([_unit(1, 0.05), _unit(0.05, 1)]), k=3)
    assert shares[0] == pytest.approx([2 / 3, 0, 1 / 3])
    assert shares[1] == pytest.approx([0, 1 / 3, 2 / 3])  # rows 3, 4, then row 2


def test_support_is_the_root_of_the_share_and_the_cues_veto_a_sign():
    mod = bench_module("judge_abstain")
    assert mod.support(np.array([0.25, 0.0, 0.75]), _inp("hmm")) == pytest.approx([0.5, 0, 0.75 ** 0.5])
    shares = np.array([0.4, 0.2, 0.4])
    praise = mod.support(shares, _inp("perfect, thanks!"))
    assert praise[0] == 0 and praise[2] == pytest.approx(0.4 ** 0.5)
    complaint = mod.support(shares, _inp("no, that's wrong"))
    assert complaint[2] == 0 and complaint[0] == pytest.approx(0.4 ** 0.5)


def test_the_answer_to_a_clarifying_question_backs_no_sign_unless_a_cue_speaks():
    mod = bench_module("judge_abstain")
    shares = np.array([0.5, 0.0, 0.5])
    asked = mod.support(shares, _inp("Canada", response="Which country are you in?", request="how do I fly?"))
    assert asked[0] == 0 and asked[2] == 0
    thanked = mod.support(shares, _inp("love it, thanks", response="How about 'Bread Pitt'?"))
    assert thanked[2] > 0 and thanked[0] == 0
    told = mod.support(shares, _inp("Canada", response="You need a licence."))
    assert told[0] > 0 and told[2] > 0


def test_the_threshold_is_the_lowest_reaching_the_precision_else_the_most_precise_with_coverage():
    mod = bench_module("judge_abstain")
    gold = np.array([1, 1, -1, -1, 0, 1])
    maj = np.array([1, 1, -1, 1, 1, 1])
    conf = np.array([0.9, 0.8, 0.7, 0.5, 0.4, 0.95])  # the two wrong ones are the least sure
    assert mod.choose_threshold(maj, conf, gold) == 0.525  # first grid step above both
    unsure = np.array([0.9, 0.8, 0.7, 0.96, 0.4, 0.95])  # a wrong one at the top: 0.95 never reached
    t = mod.choose_threshold(maj, unsure, gold)
    assert t == 0.425  # 4 of 5 scored right, coverage 4/5; higher thresholds lose coverage below 0.6


def test_a_one_seed_run_never_reads_heldout(monkeypatch):
    import judge.eval.dataset as dataset

    real = dataset.load_cases
    read = []

    def spy(split="heldout"):
        read.append(split)
        return real(split)

    monkeypatch.setattr(dataset, "load_cases", spy)
    monkeypatch.setattr("judge.eval.fit.load_cases", spy)
    out = bench_module("judge_abstain").main(["--seeds", "0"])
    assert set(read) == {"train", "validation"}
    assert set(out) == {"probability", "cues", "neighbours", "both"}
    for row in out.values():
        assert 0 < row[1] <= 1 and 0 < row[2] <= 1  # validation sign precision and coverage
