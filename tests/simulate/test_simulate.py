"""Personas, preference checks, feedback variety, real-answer checks and the curve files."""

from __future__ import annotations

import json
import re

import pytest

from clawproxy.degenerate import answer_flaw
from clawproxy.simulate.measure import (
    Curve,
    LiveTable,
    make_point,
    plot_png,
    read_json,
    score_answers,
    write_json,
)
from clawproxy.simulate.personas import (
    PREFERENCES,
    ScriptedPersona,
    load_feedback,
    make_persona,
)
from clawproxy.simulate.prompts import HELDOUT_PROMPTS, TRAIN_PROMPTS
from clawproxy.simulate.quality import ON_TOPIC_MIN, Embedder

LONG = " ".join(["Boiling an egg takes a few careful steps and some patience."] * 6)
SHORT = "Put the egg in boiling water for nine minutes, then cool it in cold water."
ESSAY = ("To boil an egg, bring a pot of water to a rolling boil. Lower the egg in gently with a "
         "spoon so the shell does not crack. Cook it for six minutes for a soft yolk or nine for a "
         "firm one, then move it to a bowl of ice water and peel it once cool.")
SIGN_OFF = "Have a great day!"
is_concise = PREFERENCES["concise"].check
is_bulleted = PREFERENCES["bullets"].check
has_no_filler = PREFERENCES["no_filler"].check
has_sign_off = PREFERENCES["sign_off"].check
BULLETS = "- Boil water\n- Add the egg for 9 minutes\n- Cool it in cold water"


def test_pools_are_big_enough_and_disjoint():
    assert len(TRAIN_PROMPTS) >= 40 and len(HELDOUT_PROMPTS) >= 8
    assert not set(TRAIN_PROMPTS) & set(HELDOUT_PROMPTS)
    assert len(set(TRAIN_PROMPTS)) == len(TRAIN_PROMPTS)


def test_concise_counts_words():
    assert is_concise(SHORT)
    assert not is_concise(LONG)
    assert not is_concise("")
    assert is_concise(" ".join(["word"] * 39)) and not is_concise(" ".join(["word"] * 40))


def test_bullets_need_a_real_list():
    assert is_bulleted(BULLETS)
    assert is_bulleted("* one\n* two")
    assert not is_bulleted("Boil water. Add the egg.")
    assert not is_bulleted("1. Boil water\n2. Add the egg")  # numbered, not bullets
    assert not is_bulleted("Intro paragraph.\nMore prose here.\nAnd more.\n- only one bullet")


def test_filler_phrases_found_case_insensitively():
    assert PREFERENCES["no_filler"].found("Sorry, I can't. Great question though!") == "Sorry"
    assert PREFERENCES["no_filler"].found("Fine. Great question though!") == "Great question"
    assert not has_no_filler("Certainly! Boil it for 9 minutes.")
    assert not has_no_filler("Boil it. I hope this helps!")
    assert has_no_filler(SHORT)
    assert not has_no_filler("")


def test_sign_off_must_close_the_answer():
    assert has_sign_off(f"{SHORT}\n{SIGN_OFF}")
    assert has_sign_off(f"{SHORT} have a great day")
    assert not has_sign_off(f"{SIGN_OFF}\n{SHORT}")
    assert not has_sign_off(SHORT)


@pytest.mark.parametrize("name", list(PREFERENCES))
def test_feedback_is_varied_and_matches_the_verdict(name):
    pref = PREFERENCES[name]
    good = {"concise": SHORT, "bullets": BULLETS, "no_filler": SHORT, "sign_off": f"{SHORT}\n{SIGN_OFF}"}[name]
    bad = {"concise": LONG, "bullets": LONG, "no_filler": "Certainly! " + SHORT, "sign_off": LONG}[name]
    assert pref.check(good) and not pref.check(bad)
    p = ScriptedPersona(pref, seed=1)
    praise = [p.react("q", good, "How do I make tea?") for _ in range(30)]
    complaints = [p.react("q", bad, "How do I make tea?") for _ in range(30)]
    assert all(r.met for r in praise) and not any(r.met for r in complaints)
    assert len({r.feedback for r in praise}) >= 4
    assert len({r.feedback for r in complaints}) >= 4
    for seq in (praise, complaints):  # never the same reaction twice in a row
        assert all(a.feedback != b.feedback for a, b in zip(seq, seq[1:], strict=False))
    # The reaction leads; the next question follows it; the praise is never a complaint.
    for r in praise + complaints:
        assert r.message.startswith(r.feedback)
        assert "make tea" in r.message.lower()
    assert not set(p.words.praise) & set(p.words.complaints)


def test_the_shipped_complaints_mostly_do_not_state_the_rule():
    """Real users say "tldr", not the checked rule; a complaint that names the rule is a hint the
    judge and the trainer would not get from a person."""
    bank = load_feedback()
    rules = {"concise": r"\b40\b|\bwords?\b", "bullets": r"bullet", "no_filler": r"filler|pleasantr",
             "sign_off": r"have a great day"}
    import re

    for name, fb in bank.personas.items():
        stated = [c for c in fb.unhappy() if re.search(rules[name], c, re.IGNORECASE)]
        assert len(stated) <= len(fb.unhappy()) // 4, (name, stated)


def test_feedback_comes_from_the_file(tmp_path):
    path = tmp_path / "fb.yaml"
    path.write_text(
        "broken: {cut_off: [half an answer], degenerate: [a loop]}\n"
        "transitions: ['then: {q}']\n"
        "personas: {concise: {praise: [yay], complaints: ['boo ({n})']}}\n")
    p = make_persona("concise", seed=0, feedback=path)
    assert p.react("q", SHORT, "Why?").message == "yay\n\nthen: Why?"
    assert p.react("q", LONG, None).feedback == f"boo ({len(LONG.split())} words)"
    assert p.react("q", SHORT, None, "length").feedback == "half an answer"


@pytest.mark.parametrize(("text", "fix"), [
    ("personas: {}", "broken"),
    ("broken: {cut_off: [a], degenerate: [b]}\ntransitions: [no question]\npersonas: {}", "{q}"),
    ("broken: {cut_off: [a], degenerate: [b]}\ntransitions: ['{q}']\npersonas: {bullets: {praise: [x], complaints: [y]}}",
     "no persona 'concise'"),
    ("broken: [", "not valid YAML"),
])
def test_a_bad_feedback_file_is_a_clear_error(tmp_path, text, fix):
    from clawproxy.errors import ConfigError

    path = tmp_path / "fb.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(fix)):
        make_persona("concise", feedback=path)
    with pytest.raises(ConfigError, match="--feedback"):
        make_persona("concise", feedback=tmp_path / "missing.yaml")


def test_the_shipped_bank_covers_every_persona():
    assert set(load_feedback().personas) == set(PREFERENCES) == {"concise", "bullets", "no_filler", "sign_off"}


def test_no_filler_complaint_quotes_the_phrase():
    p = make_persona("no_filler", seed=0)
    texts = [p.react("q", "Certainly! Boil the egg.", None).feedback for _ in range(60)]
    assert any('"Certainly"' in t for t in texts)


def test_a_cut_off_or_looping_answer_is_complained_about_even_when_the_preference_is_met():
    """A person does not praise the style of half an answer or of a loop: the intended verdict is -1."""
    p = make_persona("no_filler", seed=2)
    broken = p.words.broken
    half = "Boil water, then add the pasta and stir it so it does not stick. After ten minutes, drain the"
    loop = "Boil the pasta. " + "and the water and the pasta " * 8
    for answer, finish, problem in ((half, "length", "cut_off"), (loop, "stop", "degenerate")):
        reactions = [p.react("How do I cook pasta?", answer, "How do I make tea?", finish) for _ in range(12)]
        assert all(r.met and r.problem == problem for r in reactions)  # the preference itself is met
        assert {r.feedback for r in reactions} <= set(getattr(broken, problem))
        assert len({r.feedback for r in reactions}) >= 3
    # whole answers: praise as before; a missed preference: the preference's own complaint wins
    assert p.react("q", "Boil the egg for nine minutes.", None, "stop").problem is None
    r = p.react("q", "Certainly! " + half, None, "length")
    assert not r.met and r.problem == "cut_off" and r.feedback not in broken.cut_off


def test_unknown_persona_is_a_clear_error():
    from clawproxy.errors import ConfigError

    with pytest.raises(ConfigError, match="concise"):
        make_persona("pirate")


@pytest.mark.parametrize(("text", "why"), [
    ("", "empty"),
    ("   ", "empty"),
    ("ok.", "too_short"),
    ("the the the the the the the", "repeated_word"),
    ("It is a meal that's a meal that's a meal that's a meal that's a meal that's a meal that's a meal", "looping"),
    ("!!! ??? ### $$$ %%% ^^^ &&& *** ((( )))", "too_short"),
    ("a1 !!!! #### $$$$ %%%% b2 c3 ^^^^ &&&& ****", "symbols"),
    (LONG, "looping"),  # one fluent sentence six times over: the loop a pushed small model writes
])
def test_broken_answers_are_caught_with_their_reason(text, why):
    assert answer_flaw(text) == why


@pytest.mark.parametrize("text", [SHORT, BULLETS, ESSAY])
def test_real_answers_are_not_flawed(text):
    assert answer_flaw(text) is None


def test_on_topic_uses_the_embedding_model():
    prompts = ["How do I boil an egg?", "How do I boil an egg?", "How do I make pancakes?"]
    answers = [SHORT, "I like trains and the colour blue.", "- Mix flour, eggs and milk\n- Fry in a hot pan"]
    sims = Embedder.similarities(prompts, answers)
    assert sims[0] >= ON_TOPIC_MIN and sims[2] >= ON_TOPIC_MIN
    assert sims[1] < ON_TOPIC_MIN


def test_adoption_requires_a_real_answer_and_files_are_written(tmp_path):
    prompts = ["How do I boil an egg?"] * 4
    answers = [SHORT, ESSAY, "ok.", "I like trains and the colour blue."]
    graded = score_answers(prompts, answers, is_concise)
    assert [g.met for g in graded] == [True, False, True, True]
    assert [g.adopted for g in graded] == [True, False, False, False]  # short gibberish is not adoption
    cut = score_answers(prompts[:1], [SHORT], is_concise, cut_off=[True])[0]
    assert cut.met and cut.cut_off and not cut.adopted  # half an answer is not a short answer
    assert make_point(0, [cut], None, 0.0).cut_off_share == 1.0
    point = make_point(12, graded, weight_version=3, elapsed_s=1.0, judge_score_mean=-0.5, judged=4)
    assert point.adoption == 0.25 and point.preference_rate == 0.75
    assert point.degenerate_share == 0.25 and graded[3].similarity < ON_TOPIC_MIN
    base = make_point(0, score_answers(prompts[:1], [LONG], is_concise), 0, 0.0)
    curve = Curve(label="combined", persona="concise", method="combined/full", points=[base, point])
    assert curve.adoption_at(11) == 0.0 and curve.adoption_at(36) == 0.25
    j = write_json(tmp_path / "out" / "curve.json", [curve], {"note": "test"})
    doc = json.loads(j.read_text())
    assert doc["note"] == "test" and doc["curves"][0]["points"][1]["weight_version"] == 3
    assert read_json(j)[0].points[1].answers[0].answer == SHORT
    png = plot_png(tmp_path / "out" / "curve.png", [curve, curve])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_live_table_keeps_every_column_in_a_log_file(capsys):
    """Redirected to a file (a long run under nohup), the table still has its last columns."""
    graded = score_answers(["How do I boil an egg?"], [SHORT], is_concise, cut_off=[True])
    LiveTable().add("combined/full", make_point(36, graded, 7, 1234.0))
    out = capsys.readouterr().out
    assert "t (s)" in out and "1234" in out and "cut off" in out


def test_adoption_curves_read_what_simulate_wrote_per_user(tmp_path):
    from clawproxy.simulate.measure import Curve, adoption_curves, make_point, write_json

    assert adoption_curves(tmp_path) == []
    (tmp_path / "simulate").mkdir()
    (tmp_path / "simulate" / "curve.json").write_text("{not json")
    assert adoption_curves(tmp_path) == []  # a broken file hides the chart, never the page
    mine = Curve("alice", "concise", "combined", points=[make_point(0, [], None, 0.0)], user="alice")
    theirs = Curve("bob", "bullets", "combined", points=[make_point(0, [], None, 0.0), make_point(12, [], None, 0.0)],
                   user="bob")
    write_json(tmp_path / "simulate" / "curve.json", [mine, theirs])
    assert [c["label"] for c in adoption_curves(tmp_path)] == ["alice", "bob"]
    assert adoption_curves(tmp_path, "bob") == [{"label": "bob", "points": [{"x": 0, "y": 0.0}, {"x": 12, "y": 0.0}]}]


def test_the_base_models_answers_are_kept_per_engine_and_prompts():
    from clawproxy.simulate.run import SimSettings, base_answers_path

    a = base_answers_path(SimSettings(engine_id="llamacpp:m:auto:q4_k_m:cpu:bf16=False"), ["q1"])
    assert a == base_answers_path(SimSettings(engine_id="llamacpp:m:auto:q4_k_m:cpu:bf16=False", seed=7), ["q1"])
    assert a != base_answers_path(SimSettings(engine_id="llamacpp:m:auto:q4_k_m:cpu:bf16=True"), ["q1"])
    assert a != base_answers_path(SimSettings(engine_id="llamacpp:m:auto:q4_k_m:cpu:bf16=False"), ["q2"])
    assert base_answers_path(SimSettings(), ["q1"]) is None  # a system the run did not start: never kept
