"""Load the labeled cases as judge inputs.

Splits:
- ``train`` (cases_train.yaml, cases_train_tasks.yaml): what voters are fitted on (judge/eval/fit.py).
- ``validation`` (cases_validation.yaml): what hyper-parameters and voter choices are tuned on.
- ``heldout`` (cases_frozen.yaml): frozen, written in one go before the voters it measures; never
  fitted or tuned on, scored once per released voter (judge/eval/README.md).
- ``registers`` (cases_registers_validation.yaml): task dialogues in the registers real people use
  (failed searches, terse, polite and non-native replies, restated requests); tuned on, never fitted.
- ``heldout2`` (cases_registers_frozen.yaml): frozen like ``heldout``, in those registers.

``request`` and ``next`` are either the user's text or a list of OpenClaw messages; a list goes
through judge/extract.py, the same way the worker reads a recorded turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from judge.extract import JudgeInput, clean_user_text, last_user_request, next_state_text

HERE = Path(__file__).resolve().parent
FILES = {"train": HERE / "cases_train.yaml", "validation": HERE / "cases_validation.yaml",
         "heldout": HERE / "cases_frozen.yaml", "registers": HERE / "cases_registers_validation.yaml",
         "heldout2": HERE / "cases_registers_frozen.yaml"}
MORE = {"train": (HERE / "cases_train_tasks.yaml",)}  # further files of a split
FROZEN = ("heldout", "heldout2")  # never fitted or tuned on
LABEL_SCORE = {"bad": -1, "neutral": 0, "good": 1}
SPLITS = ("heldout", "heldout2", "validation", "registers", "train", "all")


@dataclass
class Case:
    id: str
    split: str
    label: str
    inp: JudgeInput

    @property
    def score(self) -> int:
        return LABEL_SCORE[self.label]


def _request(raw: Any) -> str:
    if isinstance(raw, list):
        return last_user_request(raw)
    return clean_user_text(str(raw))


def _next(raw: Any, role: str) -> str:
    if isinstance(raw, list):
        return next_state_text(raw, role)
    return clean_user_text(str(raw)) if role == "user" else str(raw)


def load_file(path: Path, split: str) -> list[Case]:
    out: list[Case] = []
    for raw in yaml.safe_load(path.read_text()) or []:
        if raw["label"] not in LABEL_SCORE or raw["role"] not in ("user", "tool"):
            raise ValueError(f"{path.name}: case {raw.get('id')}: bad label or role")
        inp = JudgeInput(request=_request(raw["request"]), response=str(raw["response"]),
                         next_state=_next(raw["next"], raw["role"]), role=raw["role"])
        out.append(Case(id=str(raw["id"]), split=split, label=raw["label"], inp=inp))
    return out


def load_cases(split: str = "heldout") -> list[Case]:
    """Cases of one split (see ``SPLITS``) or 'all'."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: use one of {', '.join(SPLITS)}")
    names = list(FILES) if split == "all" else [split]
    return [c for name in names for path in (FILES[name], *MORE.get(name, ())) for c in load_file(path, name)]
