"""The reader of the User Satisfaction Simulation layout, on small files written here in the same
format (the corpus itself never enters the repository), the split, the figures and `judge eval --uss`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from clawproxy.cli import main
from judge.eval import uss
from judge.eval.uss import (
    UssFormatError,
    dialogue_cases,
    load_uss,
    read_dialogues,
    uss_figures,
)

# ROLE, text, act, ratings: the layout of the corpus's dataset/*.txt, with text of our own
ONE = """USER\tI need a table for two on Friday evening.\tRestaurant-Inform\t3,3,3
SYSTEM\tI booked Olive Grove for two on Friday at 7pm.\tBooking-Book\t
USER\tPerfect, that is exactly what I wanted.\tgeneral-thank\t4,5,4
SYSTEM\tAnything else?\tgeneral-reqmore\t
USER\tWhere is it?\t\t3,3,2,3
SYSTEM\tIt is on Mill Road.\t\t
SYSTEM\tIt opens at 6pm.\t\t
USER\tOkay.\t\t3,3,3
USER\tOVERALL\t\t4,4,4
"""
TWO = """USER\tFind me a train to Ely on Sunday.\tTrain-Inform\t3,3,3
SYSTEM\tThere is a train to Leeds on Monday.\tTrain-Inform\t
USER\tNo, Ely, and Sunday.\tTrain-Inform\t2,1,2,2
USER\tOVERALL\t\t2,2,2
"""


def write(folder: Path, name: str, dialogues: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("\n" + "\n".join(dialogues))  # the corpus opens with a blank line
    return path


def test_reads_dialogues_and_makes_a_case_of_each_user_system_user_triple(tmp_path):
    path = write(tmp_path, "MWOZ.txt", [ONE, TWO])
    d1, d2 = read_dialogues(path, "MWOZ")
    assert len(d1.turns) == 8 and len(d2.turns) == 3  # the OVERALL line is no turn
    assert d1.turns[2].ratings == (4, 5, 4) and d1.turns[1].ratings == ()
    assert d1.turns[4].mean_rating == pytest.approx(2.75)
    cases = dialogue_cases(d1, "x")
    # (0, 1, 2) and (2, 3, 4); SYSTEM -> SYSTEM -> USER is no case, and neither is USER -> SYSTEM -> SYSTEM
    assert [c.id for c in cases] == ["MWOZ-0-0", "MWOZ-0-2"]
    assert [c.label for c in cases] == ["good", "neutral"]  # mean 4.33 is good, 2.75 neutral
    first = cases[0].inp
    assert (first.request, first.response, first.role) == (
        "I need a table for two on Friday evening.", "I booked Olive Grove for two on Friday at 7pm.", "user")
    assert first.next_state == "Perfect, that is exactly what I wanted."
    (bad,) = dialogue_cases(d2, "x")
    assert bad.label == "bad" and bad.inp.next_state == "No, Ely, and Sunday."  # mean 1.75


def test_the_label_bounds():
    assert [uss.label(m) for m in (1.0, 2.0, 2.01, 3.99, 4.0, 5.0)] == ["bad", "bad", "neutral", "neutral", "good", "good"]


def test_a_line_of_another_layout_is_refused_with_its_place(tmp_path):
    path = write(tmp_path, "SGD.txt", [ONE.replace("SYSTEM\tAnything else?", "BOT\tAnything else?")])
    with pytest.raises(UssFormatError, match=r"SGD.txt:5"):  # line 1 is blank, as in the corpus
        read_dialogues(path, "SGD")
    path = write(tmp_path, "SGD.txt", [ONE.replace("4,5,4", "four")])
    with pytest.raises(UssFormatError, match="ratings"):
        read_dialogues(path, "SGD")


def many(n: int) -> list[str]:
    return [ONE.replace("two", f"{i} people") for i in range(n)]


def test_the_split_is_by_dialogue_stable_and_about_three_one_one(tmp_path):
    dialogues = many(300)
    a = read_dialogues(write(tmp_path / "a", "MWOZ.txt", dialogues), "MWOZ")
    b = read_dialogues(write(tmp_path / "b", "MWOZ.txt", dialogues[::-1]), "MWOZ")
    by_text = {d.turns: d.split for d in a}
    assert all(by_text[d.turns] == d.split for d in b)  # the order of the file does not move a dialogue
    counts = {s: sum(d.split == s for d in a) for s in ("train", "validation", "test")}
    assert 150 <= counts["train"] <= 210 and 40 <= counts["validation"] <= 80 and 40 <= counts["test"] <= 80, counts
    val = load_uss(tmp_path / "a", ["MWOZ"], "validation")["MWOZ"]
    train = load_uss(tmp_path / "a", ["MWOZ"], "train")["MWOZ"]
    assert len(val) == 2 * counts["validation"] and len(train) == 2 * counts["train"]
    assert not {c.id.rsplit("-", 1)[0] for c in val} & {c.id.rsplit("-", 1)[0] for c in train}


def test_a_held_back_source_is_scored_whole_and_a_dataset_folder_is_found(tmp_path):
    write(tmp_path / "dataset", "MWOZ.txt", many(50))
    write(tmp_path / "dataset", "CCPE.txt", many(50))
    found = load_uss(tmp_path, ["MWOZ", "SGD", "CCPE"], "validation")
    assert set(found) == {"MWOZ", "CCPE"}  # no SGD.txt: no SGD
    assert len(found["CCPE"]) == 100 and len(found["MWOZ"]) < 60
    with pytest.raises(ValueError, match="split"):
        load_uss(tmp_path, ["MWOZ"], "heldout")


def test_figures_weigh_good_and_bad_half_each():
    gold = [1, 1, 1, -1, 0]
    everything_good = uss_figures(gold, [1, 1, 1, 1, 1])
    assert everything_good["coverage"] == pytest.approx(0.5) and everything_good["wrong_sign"] == pytest.approx(0.5)
    assert everything_good["neutral_signed"] == 1.0 and (everything_good["bad"], everything_good["good"]) == (1, 3)
    f = uss_figures(gold, [1, 0, 0, -1, 0])  # one good of three and the bad one, nothing wrong
    assert f["wrong_sign"] == 0.0 and f["coverage"] == pytest.approx(0.5 / 3 + 0.5) and f["neutral_signed"] == 0.0
    f = uss_figures(gold, [1, 1, 1, 0, 0])
    assert f["sign_precision"] == 1.0 and f["scored"] == pytest.approx(0.5)


def test_fit_reads_only_the_sources_it_may(tmp_path, monkeypatch, embedding_voter):
    from judge.eval import fit

    for name in ("MWOZ.txt", "SGD.txt", "ReDial.txt", "CCPE.txt"):
        write(tmp_path, name, many(20) + [TWO])
    read = []
    real = uss.read_dialogues
    monkeypatch.setattr(uss, "read_dialogues", lambda path, source: read.append(source) or real(path, source))
    cases, x, y = fit.uss_cases(tmp_path, "train")
    assert set(read) == {"MWOZ", "SGD"}
    assert cases and all(c.label != "neutral" for c in cases) and len(x) == len(y) == len(cases)


def test_eval_uss_prints_the_table_per_source(tmp_path):
    write(tmp_path, "MWOZ.txt", many(40) + [TWO] * 3)
    write(tmp_path, "ReDial.txt", many(10) + [TWO])
    r = CliRunner().invoke(main, ["judge", "eval", "--uss", str(tmp_path), "--voter", "lexical", "--uss-split", "all"])
    assert r.exit_code == 0, r.output
    for word in ("MWOZ", "ReDial", "wrong sign", "coverage", "lexical"):
        assert word in r.output
    r = CliRunner().invoke(main, ["judge", "eval", "--uss", str(tmp_path), "--voter", "lexical", "--uss-split", "all",
                                  "--json"])
    rows = json.loads(r.output)
    mwoz = next(row for row in rows if row["source"] == "MWOZ")
    assert (mwoz["bad"], mwoz["good"]) == (3, 40)  # the neutral replies are not scored
    assert {row["source"] for row in rows} == {"MWOZ", "ReDial"}


def test_eval_uss_on_a_folder_without_the_corpus_says_what_to_do(tmp_path):
    r = CliRunner().invoke(main, ["judge", "eval", "--uss", str(tmp_path), "--voter", "lexical"])
    assert r.exit_code != 0 and "dataset/" in r.output
