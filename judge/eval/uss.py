"""Real people's replies: the User Satisfaction Simulation corpus (Sun et al., SIGIR 2021).

Its ``dataset/*.txt`` files hold dialogues from MultiWOZ, SGD, ReDial and CCPE in which crowd
workers rated each user turn's satisfaction so far (1-5). The corpus has no licence, so nothing of
it enters this repository: it is read at run time from a directory a user fetched
(``clawproxy judge eval --uss DIR``; DIR holds the ``*.txt`` files or a ``dataset/`` folder of them).

Layout: one turn a line, ``ROLE<TAB>text<TAB>act<TAB>ratings`` (ratings such as ``3,3,2,3`` on USER
lines, empty on SYSTEM lines), dialogues separated by blank lines, each closed by a ``USER OVERALL``
line that rates the whole dialogue and is no turn.

A case is a USER -> SYSTEM -> USER triple: the request, the answer, and the reply that is the next
state. The reply's mean rating gives the label: <= 2 bad, >= 4 good, else neutral.

Splits: ``FIT_SOURCES`` (MWOZ, SGD) are split by dialogue, never by turn, from a hash of the
dialogue's text (stable under reordering and across machines): 3/5 train, 1/5 validation, 1/5 test.
judge/eval/fit.py fits on train and chooses on validation; test is scored once per released voter.
``HELD_BACK`` sources (ReDial, CCPE) are never read by fit.py; ``judge eval --uss`` scores them whole.

Figures (``uss_figures``) are on the cases labeled good or bad, each label weighing half: the
corpus has about three happy replies for each unhappy one, and a voter that calls everything good
must not look right.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from judge.eval.dataset import Case
from judge.extract import JudgeInput

SOURCES = {"MWOZ": "MWOZ.txt", "SGD": "SGD.txt", "ReDial": "ReDial.txt", "CCPE": "CCPE.txt"}
FIT_SOURCES = ("MWOZ", "SGD")  # fitted on (train) and chosen on (validation)
HELD_BACK = ("ReDial", "CCPE")  # never read while fitting or choosing
USS_SPLITS = ("train", "validation", "test", "all")
BAD_AT, GOOD_AT = 2.0, 4.0  # a mean rating <= 2 is bad, >= 4 good


class UssFormatError(ValueError):
    """A line that is not ``ROLE<TAB>text[<TAB>act<TAB>ratings]`` with ROLE USER or SYSTEM."""


@dataclass(frozen=True)
class Turn:
    role: str  # "USER" or "SYSTEM"
    text: str
    ratings: tuple[int, ...] = ()

    @property
    def mean_rating(self) -> float | None:
        return sum(self.ratings) / len(self.ratings) if self.ratings else None


@dataclass(frozen=True)
class Dialogue:
    source: str
    index: int  # its place in the file, for case ids
    turns: tuple[Turn, ...]

    @property
    def split(self) -> str:
        """train, validation or test, from the dialogue's own text (see the module docstring)."""
        text = "\n".join(f"{t.role}\t{t.text}" for t in self.turns)
        bucket = int(hashlib.sha256(f"{self.source}\n{text}".encode()).hexdigest(), 16) % 5
        return "train" if bucket < 3 else "validation" if bucket == 3 else "test"


def label(mean_rating: float) -> str:
    return "bad" if mean_rating <= BAD_AT else "good" if mean_rating >= GOOD_AT else "neutral"


def _ratings(field: str, where: str) -> tuple[int, ...]:
    try:
        return tuple(int(r) for r in field.replace(" ", "").split(",") if r)
    except ValueError as e:
        raise UssFormatError(f"{where}: ratings {field!r} are not comma-separated integers") from e


def read_dialogues(path: Path, source: str) -> list[Dialogue]:
    """The dialogues of one file, in file order."""
    dialogues: list[Dialogue] = []
    turns: list[Turn] = []

    def close() -> None:
        if turns:
            dialogues.append(Dialogue(source, len(dialogues), tuple(turns)))
            turns.clear()

    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            close()
            continue
        parts = line.split("\t")
        role = parts[0].strip().upper()
        if role not in ("USER", "SYSTEM") or len(parts) < 2:
            raise UssFormatError(f"{path}:{n}: expected USER or SYSTEM, a tab and the text")
        if role == "USER" and parts[1].strip() == "OVERALL":
            continue  # the whole dialogue's rating, not a turn
        ratings = _ratings(parts[3], f"{path}:{n}") if role == "USER" and len(parts) > 3 else ()
        turns.append(Turn(role, parts[1].strip(), ratings))
    close()
    return dialogues


def dialogue_cases(d: Dialogue, split: str) -> list[Case]:
    """Every USER -> SYSTEM -> USER triple whose reply is rated, labeled from that rating."""
    out = []
    for i in range(len(d.turns) - 2):
        req, resp, nxt = d.turns[i:i + 3]
        if (req.role, resp.role, nxt.role) != ("USER", "SYSTEM", "USER") or nxt.mean_rating is None:
            continue
        inp = JudgeInput(request=req.text, response=resp.text, next_state=nxt.text, role="user")
        out.append(Case(id=f"{d.source}-{d.index}-{i}", split=split, label=label(nxt.mean_rating), inp=inp))
    return out


def source_file(directory: Path, source: str) -> Path | None:
    """The source's file in ``directory`` or in its ``dataset/`` folder, if either has it."""
    for folder in (Path(directory), Path(directory) / "dataset"):
        if (folder / SOURCES[source]).is_file():
            return folder / SOURCES[source]
    return None


def load_uss(directory: Path, sources: Sequence[str] = FIT_SOURCES, split: str = "validation") -> dict[str, list[Case]]:
    """Cases per source found in ``directory``. A source of ``FIT_SOURCES`` gives the dialogues of
    ``split``; a held-back source gives all of its dialogues, whatever ``split`` says (nothing was
    fitted or chosen on it)."""
    if split not in USS_SPLITS:
        raise ValueError(f"split {split!r}: use one of {', '.join(USS_SPLITS)}")
    out: dict[str, list[Case]] = {}
    for source in sources:
        path = source_file(directory, source)
        if path is None:
            continue
        whole = split == "all" or source not in FIT_SOURCES
        out[source] = [c for d in read_dialogues(path, source) if whole or d.split == split
                       for c in dialogue_cases(d, f"uss-{split if not whole else 'all'}")]
    return out


# -- figures ---------------------------------------------------------------------------------------


def uss_figures(gold: Sequence[int], pred: Sequence[int]) -> dict[str, Any]:
    """Figures on the cases labeled ±1, each label weighing half (neutral cases only counted aside):

    - sign precision: of the turns scored ±1, the share with the right sign;
    - wrong sign: of the turns scored ±1, the share with the opposite sign (1 - sign precision);
    - coverage: of all the cases, the share scored with the right sign, which on these cases (none
      neutral) is also the share right of all;
    - scored: the share given any sign; neutral signed: of the neutral replies, the share given one.
    """
    n_bad, n_good = sum(g == -1 for g in gold), sum(g == 1 for g in gold)
    weight = {-1: 0.5 / n_bad if n_bad else 0.0, 1: 0.5 / n_good if n_good else 0.0}
    scored = right = 0.0
    for g, p in zip(gold, pred, strict=True):
        if g != 0 and p != 0:
            scored += weight[g]
            right += weight[g] * (p == g)
    total = weight[-1] * n_bad + weight[1] * n_good
    neutral = [p for g, p in zip(gold, pred, strict=True) if g == 0]
    return {
        "bad": n_bad, "good": n_good, "neutral": len(neutral),
        "sign_precision": right / scored if scored else None,
        "wrong_sign": (scored - right) / scored if scored else None,
        "coverage": right / total if total else 0.0,
        "scored": scored / total if total else 0.0,
        "neutral_signed": sum(p != 0 for p in neutral) / len(neutral) if neutral else None,
    }


def pooled(sources: Sequence[str]) -> list[tuple[str, tuple[str, ...]]]:
    """The rows of the table: each source, then each group of two or more (fitted on, held back)."""
    rows: list[tuple[str, tuple[str, ...]]] = [(s, (s,)) for s in sources]
    for group in (FIT_SOURCES, HELD_BACK):
        have = tuple(s for s in group if s in sources)
        if len(have) > 1:
            rows.append(("+".join(have), have))
    return rows


def uss_rows(reports: dict[str, Any]) -> list[dict[str, Any]]:
    """Per row of ``pooled`` and per threshold (0 and the voter's own): the figures of
    ``uss_figures``. ``reports``: source -> judge.eval.evaluate.Report of one voter."""
    out = []
    for name, group in pooled(list(reports)):
        first = reports[group[0]]
        for t in sorted({0.0, first.min_confidence}):
            gold = [g for s in group for g in reports[s].gold]
            pred = [p for s in group for p in reports[s].scored_at(t)]
            out.append({"voter": first.voter, "source": name, "min_confidence": t,
                        "chosen": t == first.min_confidence, **uss_figures(gold, pred)})
    return out


def render_uss(rows: list[dict[str, Any]], split: str, console: Any) -> None:
    """The trade-off table on real people's replies, one line per source, voter and threshold."""
    from rich.table import Table

    table = Table(title=f"real people's replies (USS; MWOZ and SGD: {split} dialogues, held-back sources: all); "
                        "good and bad weigh half each", title_justify="left")
    for col in ("source", "voter", "min confidence", "bad", "good", "sign precision", "wrong sign",
                "coverage = right of all", "scored"):
        table.add_column(col, justify="left" if col in ("source", "voter") else "right")
    for r in rows:
        sp, ws = r["sign_precision"], r["wrong_sign"]
        table.add_row(r["source"], r["voter"], f"{r['min_confidence']:g}{' *' if r['chosen'] else ''}",
                      str(r["bad"]), str(r["good"]), "-" if sp is None else f"{sp:.3f}",
                      "-" if ws is None else f"{ws:.3f}", f"{r['coverage']:.3f}", f"{r['scored']:.3f}")
    console.print(table)
    console.print("* the voter's own threshold. wrong sign: of the turns scored, the share with the opposite "
                  "sign; coverage: of all, the share scored with the right sign.")
