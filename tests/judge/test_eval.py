"""The labeled set, the eval command, and the bar for the CPU default voter on held-out cases."""

from __future__ import annotations

import re
import threading
from collections import Counter

from click.testing import CliRunner

from clawproxy.cli import main
from judge.eval.dataset import load_cases
from judge.eval.evaluate import evaluate
from judge.extract import JudgeInput
from judge.worker import Worker
from tests.judge.conftest import add_turn


def test_labeled_set_shape():
    train, held = load_cases("train"), load_cases("heldout")
    assert len(train) + len(held) >= 150 and len(held) >= 60
    assert not {c.id for c in train} & {c.id for c in held}
    for cases in (train, held):
        labels = Counter(c.label for c in cases)
        assert min(labels.values()) >= 10, labels
        assert sum(c.inp.role == "tool" for c in cases) >= 10
    # OpenClaw's timestamp prefix never reaches the voters.
    assert not any(c.inp.next_state.startswith("[") and "UTC]" in c.inp.next_state for c in train + held)


def test_eval_command_prints_figures():
    result = CliRunner().invoke(main, ["judge", "eval", "--voter", "lexical", "--split", "heldout", "--errors"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "voter=lexical" in out and "split=heldout" in out
    from judge.voters import LexicalVoter

    acc = float(re.search(r"accuracy ([0-9.]+)", out).group(1))
    # the printed figure is the lexical voter's on every held-out case, with the default 3 votes
    assert acc == round(evaluate(LexicalVoter(), load_cases("heldout"), m=3, split="heldout").accuracy, 3)
    assert "false-positive rate" in out and "false-negative rate" in out
    for name in ("good", "neutral", "bad"):
        assert name in out


def test_eval_command_json():
    import json

    result = CliRunner().invoke(main, ["judge", "eval", "--voter", "lexical", "--split", "train", "--json"])
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.output)
    assert report["n"] == len(load_cases("train")) and set(report["recall"]) == {"good", "neutral", "bad"}


def test_default_voter_passes_the_bar_on_heldout(embedding_voter):
    report = evaluate(embedding_voter, load_cases("heldout"), m=3, split="heldout")
    assert report.n >= 60
    assert report.accuracy >= 0.85, report.as_dict()
    assert report.fpr <= 0.05, report.as_dict()
    assert report.failed_votes == 0


def test_bagged_votes_are_different_views(embedding_voter):
    inp = JudgeInput(request="Explain recursion.", response="(essay)", next_state="hmm, not sure about that",
                     role="user")
    head = embedding_voter.head
    x = embedding_voter._features(inp)
    probs = [head.probs(x, i) for i in range(3)]
    # each vote asks a different bootstrap head, and the heads see the input differently
    assert head.k >= 3
    assert all(abs(probs[a] - probs[b]).max() > 1e-3 for a, b in ((0, 1), (0, 2), (1, 2)))
    for i in range(3):
        assert f"head {i}: p(bad)={probs[i][0]:.3f} p(neutral)={probs[i][1]:.3f}" in embedding_voter.vote(inp, i).raw
    assert embedding_voter.vote(inp, head.k).raw == embedding_voter.vote(inp, 0).raw  # vote i asks head i mod K


def test_worker_with_the_embedding_voter(store, embedding_voter):
    good = add_turn(store, "s", request="capital of Peru?", response="Lima.", next_user="perfect, thank you!")
    bad = add_turn(store, "s", request="Explain recursion", response="(800 words)",
                   next_user="way too long, keep it under 40 words")
    ok = add_turn(store, "s", request="run tests", response=None, tool_result="12 passed in 0.4s",
                  tool_calls=[{"id": "c", "function": {"name": "exec", "arguments": "{}"}}])
    Worker(store, embedding_voter, votes=3).run(False, 0.01, threading.Event())
    rows = {r["turn_id"]: r for r in store.query("SELECT * FROM judgments")}
    assert rows[good]["score"] == 1 and rows[ok]["score"] == 1
    assert rows[bad]["score"] == -1 and "under 40 words" in rows[bad]["hint"]
    assert rows[bad]["voter"] == "embedding"
