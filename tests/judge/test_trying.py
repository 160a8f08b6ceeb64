"""Learning by trying, the judge's half: a complaint shortlists candidates (the bank's nearest and the
user's own words), each judged reply served under one counts as its evidence once, a candidate that
passes the rule becomes a preference, and one whose replies turn bad is demoted."""

from __future__ import annotations

import threading

import pytest

from clawproxy.config import TryingConfig
from judge.trying import Trier, said_instruction
from judge.voters import LexicalVoter
from judge.worker import Worker
from tests.judge.conftest import add_turn

ESSAY = ("Tides are caused mainly by the gravitational pull of the Moon on the oceans. Because the pull is "
         "stronger on the side of the Earth facing the Moon, the water bulges there, and a second bulge forms "
         "on the far side. As the Earth turns, each coast passes through both bulges, which gives most places "
         "two high tides and two low tides a day. The Sun adds a smaller pull of its own.")
SHORT = "The Moon's pull makes the oceans bulge, so most coasts get two high tides a day."


def _served(store, turn_id: int, *, tried: int | None = None, applied: list[int] | None = None) -> None:
    store.update("turns", "id", turn_id, {"instruction": "x", "instruction_id": tried, "applied_ids": applied,
                                          "instruction_role": "try" if tried else "apply"})


def _judge(store, trier) -> int:
    return Worker(store, LexicalVoter(), votes=3, trier=trier).run(False, 0.01, threading.Event())


def test_a_complaint_shortlists_the_banks_nearest_and_the_users_own_words(store):
    add_turn(store, "s", request="explain how tides work", response="(a long essay)",
             next_user="this is far too wordy, trim it down")
    trier = Trier(store, TryingConfig(shortlist=6))
    assert _judge(store, trier) == 1
    rows = store.preferences_of(None)
    assert len(rows) == 6 and all(r["shortlisted"] and r["status"] == "candidate" for r in rows)
    said = [r for r in rows if r["source"] == "said"]
    assert [r["text"] for r in said] == ["Trim the answer down."]
    bank = [r["text"] for r in rows if r["source"] == "bank"]
    # the bank's nearest are about length; none is about, say, tables or tone
    assert any("concise" in x.lower() or "short" in x.lower() or "words" in x.lower() for x in bank[:3]), bank
    assert store.serving_preferences() and {r["id"] for r in store.serving_preferences()} == {r["id"] for r in rows}


def test_praise_shortlists_nothing_and_a_request_for_agreement_is_never_a_candidate(store):
    add_turn(store, "s", request="capital of Peru?", response="Lima.", next_user="thanks, perfect")
    _judge(store, Trier(store, TryingConfig()))
    assert store.preferences_of(None) == []
    assert said_instruction("just admit you're wrong", 12) is None
    assert said_instruction("shorter next time please", 12) == "Shorter next time."
    assert said_instruction(" ".join(["word"] * 13), 12) is None


def test_evidence_is_counted_once_and_a_candidate_that_passes_the_rule_becomes_active(store):
    cfg = TryingConfig(promote_good=2)
    pid = store.add_preference(None, "Keep replies short and to the point.", "bank", shortlisted=True, prior=0.6)
    for i in range(2):  # untried answers the user complained about
        add_turn(store, f"u{i}", request=f"q{i}", response=ESSAY, next_user="no, that's wrong, redo it")
    good = [add_turn(store, f"s{i}", request=f"question {i}", response=SHORT, next_user="thanks, perfect")
            for i in range(2)]
    toolish = add_turn(store, "t", request="read it", response=SHORT, next_user="thanks!",
                       tool_calls=[{"id": "c", "function": {"name": "read", "arguments": "{}"}}])
    for t in [*good, toolish]:
        _served(store, t, tried=pid)
    trier = Trier(store, cfg)
    _judge(store, trier)
    row = store.preference(pid)
    # the reply that called a tool says nothing about style: not counted
    assert (row["tries"], row["good"], row["bad"], row["status"]) == (2, 2, 0, "active")
    assert row["activated_at"] is not None
    assert _judge(store, trier) == 0 and store.preference(pid)["tries"] == 2  # judged once, counted once


def test_a_candidate_no_likelier_liked_than_the_untried_replies_stays_a_candidate(store):
    pid = store.add_preference(None, "Use bullet points for lists of items.", "bank", shortlisted=True)
    turns = [add_turn(store, "s", request="q", response="a", next_user=reply)
             for reply in ("no, that's wrong", "no, that is not it", "thanks, perfect", "thanks, perfect")]
    for t in turns:
        _served(store, t, tried=pid)
    _judge(store, Trier(store, TryingConfig(shortlist=6)))
    row = store.preference(pid)
    assert (row["good"], row["bad"]) == (2, 2) and row["status"] == "candidate"


def test_one_wrong_sign_does_not_block_a_candidate_the_user_plainly_prefers(store):
    pid = store.add_preference(None, "Answer in one sentence.", "bank", shortlisted=True)
    for i in range(4):  # untried answers the user complained about
        add_turn(store, f"u{i}", request=f"q{i}", response=ESSAY, next_user="no, that's wrong, redo it")
    tried = [add_turn(store, f"t{i}", request=f"r{i}", response=SHORT, next_user=reply)
             for i, reply in enumerate(("thanks, perfect", "no, that's wrong", "thanks, perfect"))]
    for t in tried:
        _served(store, t, tried=pid)
    _judge(store, Trier(store, TryingConfig()))
    row = store.preference(pid)
    assert (row["good"], row["bad"], row["status"]) == (2, 1, "active")


def test_p_better_is_the_chance_one_beta_posterior_exceeds_the_other():
    from judge.trying import p_better

    assert p_better((0, 0), (0, 0)) == pytest.approx(0.5, abs=1e-6)
    assert p_better((1, 0), (0, 0)) == pytest.approx(2 / 3, abs=1e-3)  # Beta(2,1) over a uniform
    assert p_better((1, 0), (0, 4)) > 0.95 > p_better((1, 1), (0, 4)) > 0.85
    assert p_better((0, 4), (1, 0)) == pytest.approx(1 - p_better((1, 0), (0, 4)), abs=1e-4)


def test_an_active_preference_whose_replies_turn_bad_is_demoted_and_an_absorbed_one_goes_back_to_the_prompt(store):
    cfg = TryingConfig(demote_window=4, demote_bad=3)
    pid = store.add_preference(None, "Answer in one sentence.", "manual", status="active")
    store.set_preference_gap(pid, 0.001, absorbed=True)
    bad = [add_turn(store, "s", request="q", response=SHORT, next_user="no, that's wrong, redo it")
           for _ in range(3)]
    for t in bad:
        _served(store, t, applied=[pid])
    trier = Trier(store, cfg)
    _judge(store, trier)
    row = store.preference(pid)
    assert row["status"] == "active" and not row["absorbed"]  # first back into the prompt
    more = [add_turn(store, "s", request="q", response=SHORT, next_user="no, that's wrong, redo it")
            for _ in range(3)]
    for t in more:
        _served(store, t, applied=[pid])
    _judge(store, trier)
    assert store.preference(pid)["status"] == "demoted"
    assert store.serving_preferences() == [] or all(r["id"] != pid for r in store.serving_preferences())


def test_an_active_preference_the_user_keeps_asking_to_change_is_demoted(store):
    """Replies that ask for a change are scored 0 leaning bad (never samples); under an active
    preference they are still the user saying it is wrong, and demote it."""
    from judge.voters import Vote

    class Pleased(LexicalVoter):  # the voter misreads the requests as happy; the worker knows better
        def vote(self, inp, idx):
            return Vote(1)

    pid = store.add_preference(None, "Write in long paragraphs.", "bank", status="active")
    for _ in range(3):
        _served(store, add_turn(store, "s", request="q", response=ESSAY, next_user="could you redo that as a table"),
                applied=[pid])
    trier = Trier(store, TryingConfig(demote_window=4, demote_bad=3))
    Worker(store, Pleased(), votes=3, trier=trier).run(False, 0.01, threading.Event())
    assert [r["score"] for r in store.served_under(pid)] == [0, 0, 0]
    assert store.preference(pid)["status"] == "demoted"


def test_the_shortlist_keeps_candidates_with_evidence_and_replaces_those_that_failed(store):
    cfg = TryingConfig(shortlist=3)
    trier = Trier(store, cfg)
    add_turn(store, "s", request="explain tides", response="(essay)", next_user="this is far too wordy, trim it down")
    _judge(store, trier)
    first = [r for r in store.preferences_of(None) if r["shortlisted"]]
    assert len(first) == 3
    keep, fail = first[0], first[1]
    store.update("preferences", "id", keep["id"], {"tries": 1, "good": 1})
    store.update("preferences", "id", fail["id"], {"tries": 2, "bad": 2})
    add_turn(store, "s", request="explain rain", response="(essay)", next_user="still far too wordy, cut it down more")
    _judge(store, trier)
    now = {r["id"] for r in store.preferences_of(None) if r["shortlisted"]}
    assert keep["id"] in now and fail["id"] not in now and len(now) == 3
    assert store.preference(fail["id"])["tries"] == 2  # its evidence is kept


def test_an_abstention_leans_the_way_its_majority_did(store):
    pid = store.add_preference(None, "Answer in one sentence.", "bank", shortlisted=True)
    turns = [add_turn(store, f"s{i}", request="q", response="a", next_user="x") for i in range(3)]
    for t in turns:
        _served(store, t, tried=pid)
    for t, (score, majority) in zip(turns, [(0, 1), (0, -1), (1, 1)], strict=True):
        assert store.record_judgment(t, score=score, hint=None, voter="v", votes=[], majority=majority)
    row = store.preference(pid)
    assert (row["tries"], row["good"], row["bad"], row["leaned_good"], row["leaned_bad"]) == (3, 1, 0, 1, 1)
    from judge.trying import evidence, promotable

    assert evidence(row, 0.5) == (1.5, 0.5)
    unhappy = (0.0, 4.0)
    assert not promotable(row, unhappy, TryingConfig(promote_good=2))  # 1.5 < 2
    assert promotable({**row, "leaned_good": 2}, unhappy, TryingConfig(promote_good=2))
    assert not promotable({**row, "good": 0, "leaned_good": 6}, unhappy, TryingConfig(promote_good=2))  # none judged outright
    assert not promotable({**row, "leaned_good": 2}, (4.0, 0.0), TryingConfig(promote_good=2))  # untried ones liked as much


def test_only_a_request_in_the_users_words_is_a_candidate():
    assert said_instruction("ok. just give me the number.", 12) == "Just give me the number."
    assert said_instruction("this is far too wordy, trim it down", 12) is not None
    # a description of the problem is not an instruction to serve back
    assert said_instruction("I can never find the part I need in these.", 12) is None
    assert said_instruction("hard to follow", 12) is None


def test_the_banks_places_are_near_the_complaints_and_unlike_each_other():
    import numpy as np

    from judge.hints import InstructionChooser

    # two near-duplicates nearest the complaint, and a different reading a little further away
    bank = ["Keep paragraphs short.", "Keep each paragraph short.", "Use bullet points.", "Write a poem."]
    vecs = {"Keep paragraphs short.": [0.95, 0.312, 0.0], "Keep each paragraph short.": [0.94, 0.341, 0.0],
            "Use bullet points.": [0.9, 0.0, 0.436], "Write a poem.": [0.0, 0.0, 1.0], "too dense": [1.0, 0.0, 0.0]}

    def embed(texts):
        m = np.array([vecs[t] for t in texts])
        return m / np.linalg.norm(m, axis=1, keepdims=True)

    chooser = InstructionChooser(instructions=bank, embed=embed, shortlist=4)
    assert [x for _, x in chooser.diverse(["too dense"], 2, novelty=0.0)] == bank[:2]
    assert [x for _, x in chooser.diverse(["too dense"], 2, novelty=0.5)] == ["Keep paragraphs short.",
                                                                              "Use bullet points."]
    # what is already on the shortlist counts as chosen; what is not allowed is never offered
    assert [x for _, x in chooser.diverse(["too dense"], 1, taken=["Keep paragraphs short."])] == [
        "Use bullet points."]
    assert "Use bullet points." not in [x for _, x in chooser.diverse(
        ["too dense"], 3, allowed=lambda x: x != "Use bullet points.")]


@pytest.mark.parametrize(("reply", "instruction"), [
    ("could I have it as a table", "Give the answer as a table."),
    ("could you cut that down a bit", "Cut the answer down a bit."),
    ("I'd like it shorter", "Make the answer shorter."),
    ("I would like you to use headings", "Use headings."),
    ("split it up? one step per line", "Split the answer up. One step per line."),
    ("split it up? one step per line ok", "Split the answer up. One step per line ok."),
    ("split it up? one step per line. ok", "Split the answer up. One step per line."),
    ("sorry, I'm in a hurry. shorter?", "Shorter."),
    ("Could you please add a summary at the end?", "Add a summary at the end."),
    # the next question in the same message is a task, not part of the instruction
    ("shorter please What is a lease?", "Shorter."),
    ("can you use a table? which plan costs less", "Use a table."),
    ("use a table, how does that compare", "Use a table."),
])
def test_a_request_in_its_common_forms_becomes_an_instruction(reply, instruction):
    assert said_instruction(reply, 12) == instruction


def test_a_candidate_that_changed_nothing_or_broke_answers_is_not_promoted_on_good_signs(store):
    """The judge's wrong signs (praise read into complaints) cannot make a preference of an
    instruction whose answers look like the ones the user complained about, or are no answers."""
    unchanged = store.add_preference(None, "Avoid contractions.", "bank", shortlisted=True)
    broken = store.add_preference(None, "Answer in one word.", "bank", shortlisted=True)
    fixed = store.add_preference(None, "Answer in one sentence.", "bank", shortlisted=True)
    for i in range(4):
        add_turn(store, f"u{i}", request=f"q{i}", response=ESSAY, next_user="no, that's wrong, redo it")
    for pid, response in ((unchanged, ESSAY.replace("Tides", "The tides")), (broken, "Moon."), (fixed, SHORT)):
        for i in range(2):
            _served(store, add_turn(store, f"t{pid}{i}", request="q", response=response, next_user="thanks, perfect"),
                    tried=pid)
    trier = Trier(store, TryingConfig())
    _judge(store, trier)
    status = {pid: store.preference(pid)["status"] for pid in (unchanged, broken, fixed)}
    assert status == {unchanged: "candidate", broken: "candidate", fixed: "active"}
    assert trier.what_blocks(store.preference(unchanged), None) == "unchanged"
    assert trier.what_blocks(store.preference(broken), None) == "broken"
    assert Trier(store, TryingConfig(min_movement=0)).what_blocks(store.preference(unchanged), None) is None


def test_an_active_preference_whose_answers_are_broken_is_demoted(store):
    pid = store.add_preference(None, "Answer in one word.", "bank", status="active")
    for i in range(2):
        _served(store, add_turn(store, f"s{i}", request="q", response="Moon.", next_user="thanks, perfect"),
                applied=[pid])
    _judge(store, Trier(store, TryingConfig()))
    assert store.preference(pid)["status"] == "demoted"


def test_a_request_for_a_change_is_never_praise_and_shortlists_the_users_words(store):
    """A voter may read "can you rewrite that so I can scan it" as happy; it asks for a change, so
    it is no sample, leans unhappy, and the user's request becomes a candidate in their words."""
    from judge.voters import Vote

    class Pleased(LexicalVoter):
        def vote(self, inp, idx):
            return Vote(1)

    tid = add_turn(store, "s", request="explain tides", response=ESSAY, next_user="can you rewrite that so I can scan it")
    trier = Trier(store, TryingConfig(shortlist=3))
    Worker(store, Pleased(), votes=3, trier=trier).run(False, 0.01, threading.Event())
    row = store.query_one("SELECT score, majority FROM judgments WHERE turn_id=?", (tid,))
    assert (row["score"], row["majority"]) == (0, -1)
    said = [r["text"] for r in store.preferences_of(None) if r["source"] == "said"]
    assert said == ["Rewrite the answer so I can scan it."]
    thanks = add_turn(store, "s2", request="q", response=SHORT, next_user="great, thanks a lot")
    Worker(store, Pleased(), votes=3, trier=trier).run(False, 0.01, threading.Event())
    assert store.query_one("SELECT score FROM judgments WHERE turn_id=?", (thanks,))["score"] == 1
