"""bench/hinted.py: greedy answers untold, told (the persona's instruction as the hint) and complained
to (its complaints as the hint), graded by the persona's check, with the trainer's own hint format."""

from __future__ import annotations

import json

from tests.trainer.util import bench_module
from trainer.batch import HINT_TEMPLATE


def test_hint_is_what_the_teacher_sees():
    told = bench_module("hinted").hinted_prompt("How do I boil an egg?", "Answer in under 40 words.")
    assert told == "How do I boil an egg?\n\n" + HINT_TEMPLATE.format(hint="Answer in under 40 words.")


def test_three_conditions_per_persona(tmp_path, tiny_model_dir):
    out = tmp_path / "hinted.json"
    rows = bench_module("hinted").main(["--persona", "concise", "--persona", "bullets", "--prompts", "2",
                                        "--max-tokens", "4", "--model", str(tiny_model_dir), "--out", str(out)])
    assert [(r["persona"], r["condition"]) for r in rows] == [
        (p, c) for p in ("concise", "bullets") for c in ("untold", "told", "complained")]
    assert all(r["n"] == 2 and len(r["answers"]) == 2 and 0 <= r["adoption"] <= r["preference_rate"] <= 1
               for r in rows)
    assert json.loads(out.read_text())[0]["condition"] == "untold"
