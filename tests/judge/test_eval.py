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
    train, val, held = load_cases("train"), load_cases("validation"), load_cases("heldout")
    assert len(held) >= 300 and len(val) >= 100 and len(train) >= 2 * len(held)
    ids = [c.id for c in train + val + held]
    assert len(ids) == len(set(ids))
    assert not {c.inp.next_state for c in held} & {c.inp.next_state for c in train + val if len(c.inp.next_state) > 12}
    for cases in (train, val, held):
        labels = Counter(c.label for c in cases)
        assert min(labels.values()) >= 10, labels
    assert sum(c.inp.role == "tool" for c in train) >= 10 and sum(c.inp.role == "tool" for c in held) >= 30
    # OpenClaw's wire furniture (timestamp, Runtime line, internal-context message) never reaches the voters.
    for c in train + val + held:
        assert not (c.inp.next_state.startswith("[") and "UTC]" in c.inp.next_state), c.id
        assert "OPENCLAW_INTERNAL_CONTEXT" not in c.inp.next_state + c.inp.request, c.id
        assert "Runtime: agent=" not in c.inp.request, c.id


def test_heldout_cases_in_openclaw_wire_format_are_read_like_recorded_turns():
    import yaml

    from judge.eval.dataset import FILES

    raw = {c["id"]: c for c in yaml.safe_load(FILES["heldout"].read_text())}
    wired = [i for i, c in raw.items() if isinstance(c["next"], list) or isinstance(c["request"], list)]
    assert len(wired) >= 10
    held = {c.id: c for c in load_cases("heldout")}
    for i in wired:
        assert held[i].inp.next_state and held[i].inp.request, i


def test_eval_command_prints_figures():
    result = CliRunner().invoke(main, ["judge", "eval", "--voter", "lexical", "--split", "validation", "--errors"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "voter=lexical" in out and "split=validation" in out
    from judge.voters import LexicalVoter

    acc = float(re.search(r"accuracy ([0-9.]+)", out).group(1))
    # the printed figure is the lexical voter's on every validation case, with the default 3 votes
    assert acc == round(evaluate(LexicalVoter(), load_cases("validation"), m=3, split="validation").accuracy, 3)
    assert "false-positive rate" in out and "false-negative rate" in out
    for name in ("good", "neutral", "bad"):
        assert name in out


def test_eval_command_json():
    import json

    result = CliRunner().invoke(main, ["judge", "eval", "--voter", "lexical", "--split", "train", "--json"])
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.output)
    assert report["n"] == len(load_cases("train")) and set(report["recall"]) == {"good", "neutral", "bad"}


def test_default_voter_meets_the_bar_on_validation(embedding_voter):
    # the shipped head saw validation: these bars catch a broken head, they measure nothing
    report = evaluate(embedding_voter, load_cases("validation"), m=3, split="validation")
    assert report.sign_precision >= 0.95 and report.coverage >= 0.6, report.as_dict()
    everything = report.tradeoff([0.0])[0]
    assert everything["accuracy"] >= 0.85 and everything["fpr"] <= 0.05, everything
    assert report.failed_votes == 0


def test_heldout_figures_in_the_readme_are_the_shipped_voters(embedding_voter):
    """judge/eval/README.md records the released voter's held-out score; a changed voter fails here
    until it is scored once and recorded."""
    from pathlib import Path

    report = evaluate(embedding_voter, load_cases("heldout"), m=3, split="heldout")
    readme = (Path(__file__).resolve().parents[2] / "judge" / "eval" / "README.md").read_text()
    row = f"| **{report.accuracy:.3f}** | **{report.fpr:.3f}** | {report.fnr:.3f} |"
    assert row in readme, report.as_dict()


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
    bad = add_turn(store, "s", request="What's the capital of Peru?", response="Cusco.",
                   next_user="no, that's wrong. it's Lima")
    ok = add_turn(store, "s", request="run tests", response=None, tool_result="12 passed in 0.4s",
                  tool_calls=[{"id": "c", "function": {"name": "exec", "arguments": "{}"}}])
    Worker(store, embedding_voter, votes=3).run(False, 0.01, threading.Event())
    rows = {r["turn_id"]: r for r in store.query("SELECT * FROM judgments")}
    assert rows[good]["score"] == 1 and rows[ok]["score"] == 1
    assert rows[bad]["score"] == -1 and "Lima" in rows[bad]["hint"]
    assert rows[bad]["voter"] == "embedding"


def test_a_question_after_the_reaction_does_not_decide_the_verdict(embedding_voter):
    """People react, then ask the next thing in the same message; the verdict is on the reaction."""
    from judge.embedding import reaction

    assert reaction("nope, 12 not 21\n\nalso, what's 7 x 8?") == "nope, 12 not 21"
    assert reaction("ok. what's 7 x 8?") == "ok. what's 7 x 8?"
    base = dict(request="What's 3 x 4?", response="21.", role="user")
    for reply in ("nope, it's 12", "wrong again, 12", "great, thanks!"):
        alone = [embedding_voter.vote(JudgeInput(next_state=reply, **base), i).score for i in range(3)]
        asked = [embedding_voter.vote(JudgeInput(next_state=f"{reply}\n\nnext: how do I bake bread?", **base), i).score
                 for i in range(3)]
        assert alone == asked, reply
