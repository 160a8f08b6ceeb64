"""bench/hinted.py: greedy answers untold, told (the persona's instruction as the hint) and complained
to (its complaints as the hint), graded by the persona's check, with the trainer's own hint format."""

from __future__ import annotations

import json

from clawproxy.simulate.personas import PREFERENCES
from clawproxy.simulate.prompts import TRAIN_PROMPTS
from tests.bench.util import bench_module
from trainer.batch import HINT_TEMPLATE


def test_hint_is_what_the_teacher_sees():
    told = bench_module("hinted").hinted_prompt("How do I boil an egg?", "Answer in under 40 words.")
    assert told == "How do I boil an egg?\n\n" + HINT_TEMPLATE.format(hint="Answer in under 40 words.")


def test_conditions_per_persona(tmp_path, tiny_model_dir):
    out = tmp_path / "hinted.json"
    rows = bench_module("hinted").main(["--persona", "concise", "--persona", "bullets", "--prompts", "2",
                                        "--max-tokens", "4", "--model", str(tiny_model_dir), "--out", str(out)])
    assert [(r["persona"], r["condition"]) for r in rows] == [
        (p, c) for p in ("concise", "bullets") for c in ("untold", "told", "complained", "quoted", "quote_bare",
                                                         "quote_framed", "memory", "examples", "chosen", "chosen_quote")]
    for r in rows:
        assert list(r["answers"]) == list(TRAIN_PROMPTS[:2])
        met = [PREFERENCES[r["persona"]].check(a) for a in r["answers"].values()]
        assert r["n"] == 2 and r["preference_rate"] == sum(met) / 2
        assert r["adoption"] <= r["preference_rate"]  # adopted = met and a real answer
    untold = [r["answers"] for r in rows if r["condition"] == "untold"]
    assert untold[0] == untold[1]  # one set of plain answers, graded per persona
    assert json.loads(out.read_text())[0]["condition"] == "untold"
    hints = {(r["persona"], r["condition"]): r["hints"] for r in rows if "hints" in r}
    assert all(len(h) == 2 for h in hints.values())  # the judge's hint per prompt, kept for reading
    for p in ("concise", "bullets"):  # one quote, three framings: the same message or no hint in each
        bare = hints[(p, "quote_bare")]
        assert any(b is not None for b in bare)
        assert [h is None for h in hints[(p, "quoted")]] == [h is None for h in bare]
        for b, q, f in zip(bare, hints[(p, "quoted")], hints[(p, "quote_framed")], strict=True):
            if b is not None:
                assert b != q != f and b in q and b in f
        # the memory conditions read this reply and the one before it (two prompts, --reactions 3)
        for memory, quote in zip(hints[(p, "memory")], bare, strict=True):
            assert memory is None or quote is None or quote in memory
