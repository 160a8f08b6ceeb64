"""A verdict with a confidence: the majority of m votes scores 0 when it is not sure enough, and the
store tells an abstention from a neutral verdict (`clawproxy stats`, the dashboard)."""

from __future__ import annotations

import threading

import pytest

from judge.voters import LexicalVoter, Vote, combine
from judge.worker import Worker
from tests.judge.conftest import add_turn


def _p(bad: float, neutral: float, good: float) -> tuple[float, float, float]:
    return (bad, neutral, good)


def test_confidence_is_the_votes_mean_probability_of_the_majority():
    votes = [Vote(1, probs=_p(0.1, 0.1, 0.8)), Vote(1, probs=_p(0.2, 0.2, 0.6)), Vote(0, probs=_p(0.3, 0.4, 0.3))]
    v = combine(votes)
    assert (v.majority, v.score) == (1, 1)
    assert v.confidence == pytest.approx((0.8 + 0.6 + 0.3) / 3)
    below = combine(votes, min_confidence=0.6)
    assert (below.majority, below.score, below.abstained) == (1, 0, True)
    assert combine(votes, min_confidence=0.56).score == 1


def test_votes_without_probabilities_count_as_sure_of_their_own_score():
    # the LLM voter's votes carry no probabilities: its confidence is the share that agree
    two_of_three = [Vote(-1), Vote(-1), Vote(1)]
    assert combine(two_of_three).confidence == pytest.approx(2 / 3)
    assert combine(two_of_three, min_confidence=0.7).score == 0
    assert combine([Vote(-1)] * 3, min_confidence=0.99).score == -1


def test_a_failed_vote_is_evidence_for_nothing_and_a_zero_majority_has_no_confidence():
    v = combine([Vote(1), Vote(1), Vote(None, error="malformed")])
    assert v.confidence == pytest.approx(2 / 3)
    tie = combine([Vote(1), Vote(-1), Vote(0)])
    assert (tie.majority, tie.confidence, tie.score, tie.abstained) == (0, None, 0, False)


class _Unsure:
    """A voter whose every vote leans good at p=0.55."""

    name = "unsure"
    min_confidence = 0.0

    def vote(self, inp, idx):
        return Vote(1, probs=(0.2, 0.25, 0.55))


def test_the_worker_writes_majority_and_confidence_and_stats_count_abstentions(store):
    sure = add_turn(store, "s", request="capital of Peru?", response="Lima.", next_user="perfect, thanks!")
    Worker(store, LexicalVoter(), votes=3).run(False, 0.01, threading.Event())
    unsure = add_turn(store, "s", request="and Chile?", response="Santiago.", next_user="hmm, nice")
    Worker(store, _Unsure(), votes=3, min_confidence=0.8).run(False, 0.01, threading.Event())
    rows = {r["turn_id"]: r for r in store.query("SELECT * FROM judgments")}
    assert (rows[sure]["score"], rows[sure]["majority"], rows[sure]["confidence"]) == (1, 1, 1.0)
    assert (rows[unsure]["score"], rows[unsure]["majority"]) == (0, 1)
    assert rows[unsure]["confidence"] == pytest.approx(0.55)
    assert store.judge_summary() == {"judged": 2, "scored": 1, "abstained": 1, "neutral": 0}


def test_the_embedding_voter_abstains_below_its_validated_threshold(embedding_voter):
    from judge.eval.dataset import load_cases
    from judge.eval.evaluate import evaluate

    assert 0.5 <= embedding_voter.min_confidence < 1  # chosen by judge.eval.fit, shipped in the head
    cases = load_cases("validation")[::4]
    report = evaluate(embedding_voter, cases, m=3, split="validation")
    loose, strict = report.tradeoff([0.0, 0.9])
    assert report.min_confidence == embedding_voter.min_confidence
    # the threshold only ever turns a ±1 into a 0
    assert all(p in (0, m) for p, m in zip(report.pred, report.majority, strict=True))
    assert loose["scored"] >= sum(p != 0 for p in report.pred) >= strict["scored"]
    assert loose["scored"] > strict["scored"]  # a higher threshold abstains on turns the votes lean on


def test_a_turn_that_cannot_be_read_is_judged_by_its_failed_votes_and_the_worker_goes_on(store):
    broken = add_turn(store, "s", request="hi", response="hello", next_user="thanks")
    store.update("turns", "id", broken, {"next_state": 5})  # not a list of messages: from_turn raises
    fine = add_turn(store, "s", request="capital of Peru?", response="Lima.", next_user="perfect, thanks!")
    worker = Worker(store, LexicalVoter(), votes=3, max_attempts=1)
    assert worker.run(False, 0.01, threading.Event()) == 2
    rows = {r["turn_id"]: r for r in store.query("SELECT * FROM judgments")}
    assert rows[broken]["score"] == 0 and rows[fine]["score"] == 1
    assert [r["turn_id"] for r in store.reactions_of(None)] == [fine]
