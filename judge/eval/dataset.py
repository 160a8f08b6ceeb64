"""Load the labeled cases (cases_train.yaml, cases_heldout.yaml) as judge inputs.

The held-out file is never used to fit or tune anything; ``load_cases("train")`` is what the
embedding head is fitted on (see judge/eval/fit.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from judge.extract import JudgeInput, clean_user_text

HERE = Path(__file__).resolve().parent
FILES = {"train": HERE / "cases_train.yaml", "heldout": HERE / "cases_heldout.yaml"}
LABEL_SCORE = {"bad": -1, "neutral": 0, "good": 1}
SPLITS = ("heldout", "train", "all")


@dataclass
class Case:
    id: str
    split: str
    label: str
    inp: JudgeInput

    @property
    def score(self) -> int:
        return LABEL_SCORE[self.label]


def load_cases(split: str = "heldout") -> list[Case]:
    """Cases of one split ('train', 'heldout') or 'all'."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: use one of {', '.join(SPLITS)}")
    names = ["train", "heldout"] if split == "all" else [split]
    out: list[Case] = []
    for name in names:
        for raw in yaml.safe_load(FILES[name].read_text()):
            if raw["label"] not in LABEL_SCORE or raw["role"] not in ("user", "tool"):
                raise ValueError(f"case {raw.get('id')}: bad label or role")
            nxt = str(raw["next"])
            if raw["role"] == "user":
                nxt = clean_user_text(nxt)
            inp = JudgeInput(
                request=clean_user_text(str(raw["request"])),
                response=str(raw["response"]),
                next_state=nxt,
                role=raw["role"],
            )
            out.append(Case(id=str(raw["id"]), split=name, label=raw["label"], inp=inp))
    return out
