"""Learning by trying, the judge's half: after each judgment, a user's candidates and preferences.

The proxy serves an unhappy user's next answers under candidate instructions (``clawproxy/proxy/
trying.py``); the judge's sign on each such reply is counted as that candidate's evidence in the
judgment's own transaction (``Store.record_judgment``). Here, after a judgment:

- **shortlist**: after a complaint, the user's shortlisted candidates that have not failed stay,
  and the free places go to up to two short complaints of their own that the judge took a hint
  from and that ask for something ("shorter, please", not "I can never find the part I need"), then to the bank's
  instructions (``judge/data/instructions.txt``) near their recent complaints by sentence embedding
  and unlike each other (maximal marginal relevance over the nearest four times the shortlist);
- **promote**: a candidate becomes an active preference when its replies are likely liked more often
  than the user's untried ones: P(θ_candidate > θ_untried) >= ``promote_confidence`` under Beta
  posteriors (one wrong sign from the judge does not block a candidate the user plainly prefers);
- **demote**: an active preference whose last ``demote_window`` scored replies hold ``demote_bad``
  bad ones goes back into the prompt if the adapter had absorbed it, else is demoted.

Only instructions about style and form are candidates: the bank holds nothing else, and a complaint
that asks the model to agree or concede is never one.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clawproxy.config import TryingConfig
from clawproxy.store import Store
from judge.hints import InstructionChooser

log = logging.getLogger(__name__)

SAID_KEPT = 2  # the user's own words: the newest two complaints, beside the bank's nearest
MEMORY_READ = 6  # complaints the shortlist is computed from, newest first
NOVELTY = 0.5  # the bank's places by maximal marginal relevance: nearest the complaints, unlike each other
# A complaint that asks for agreement, not for a style: never served back as an instruction.
_NOT_STYLE = re.compile(r"\b(agree|admit|concede|apolog\w*|say (?:yes|that|i'?m)|i'?m right|you'?re wrong)\b",
                        re.IGNORECASE)


# A clause that asks for something: "please", or an imperative or comparative first word.
_REQUEST_START = frozenset("""
add answer avoid be break bring change cut cite don't dont drop explain fewer format
give include keep leave less limit list make more move number only put quit remove
rephrase reply respond say separate shorten shorter show simplify skip slow speak spell split start
state stick stop structure summarize summarise talk tell trim try use write just longer
""".split())
_CLAUSES = re.compile(r"[.,;:!?]+\s*")


def asks(text: str) -> bool:
    """Whether the reply asks for something ("shorter, please", "ok. just give me the number"), rather than
    only describing a problem ("I can never find the part I need"): only a request is served back as an instruction."""
    if re.search(r"\bplease\b", text, re.IGNORECASE):
        return True
    for clause in _CLAUSES.split(text.lower()):
        words = re.findall(r"[a-z']+", clause)
        if words and words[0] in _REQUEST_START:
            return True
    return False


def said_instruction(text: str, max_words: int) -> str | None:
    """The user's complaint as a candidate instruction, or None: too long, empty, not a request, or
    not about style."""
    text = " ".join(text.split()).strip()
    if not text or len(text.split()) > max_words or _NOT_STYLE.search(text) or not asks(text):
        return None
    return text


def evidence(row: dict[str, Any], abstain_weight: float) -> tuple[float, float]:
    """(good, bad): the judged replies, and the abstentions at ``abstain_weight`` by their majority."""
    return (int(row["good"]) + abstain_weight * int(row["leaned_good"]),
            int(row["bad"]) + abstain_weight * int(row["leaned_bad"]))


def failed(row: dict[str, Any], abstain_weight: float) -> bool:
    """A candidate with at least two more bad replies than good: it leaves the shortlist."""
    good, bad = evidence(row, abstain_weight)
    return bad - good >= 2


def p_better(mine: tuple[float, float], other: tuple[float, float], grid: int = 400) -> float:
    """P(θ_mine > θ_other) for θ ~ Beta(1 + good, 1 + bad) from two (good, bad) records: the
    integral of one density against the other's distribution function, on a midpoint grid."""
    def density(good: float, bad: float) -> list[float]:
        a, b = 1.0 + good, 1.0 + bad
        c = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
        xs = ((i + 0.5) / grid for i in range(grid))
        return [math.exp(c + (a - 1) * math.log(x) + (b - 1) * math.log1p(-x)) / grid for x in xs]

    p = below = 0.0
    for f, g in zip(density(*mine), density(*other), strict=True):
        p += f * (below + g / 2)
        below += g
    return p


def untried_evidence(rows: list[dict[str, Any]], abstain_weight: float) -> tuple[float, float]:
    """(good, bad) of the user's untried replies (``Store.untried_scores``), abstentions by their majority."""
    good = sum(1.0 if r["score"] == 1 else abstain_weight if r["score"] == 0 and r["majority"] == 1 else 0.0
               for r in rows)
    bad = sum(1.0 if r["score"] == -1 else abstain_weight if r["score"] == 0 and r["majority"] == -1 else 0.0
              for r in rows)
    return good, bad


def promotable(row: dict[str, Any], untried: tuple[float, float], cfg: TryingConfig) -> bool:
    """At least one reply judged good outright and ``promote_good`` good evidence, and its replies
    likelier liked than the untried ones by ``promote_confidence``."""
    good, bad = evidence(row, cfg.abstain_weight)
    return (int(row["good"]) >= 1 and good >= cfg.promote_good
            and p_better((good, bad), untried) >= cfg.promote_confidence)


@dataclass
class Trier:
    store: Store
    cfg: TryingConfig
    chooser: InstructionChooser | None = None  # built on first use: the embedding model loads once
    embed: Callable[[list[str]], Any] | None = None

    def after_judgment(self, turn: dict[str, Any], score: int, hint: str | None) -> None:
        """Update the turn's user's shortlist (after a complaint), then promote and demote."""
        user = turn.get("user")
        if score == -1 and self.cfg.enabled:
            self.shortlist(user)
        self.promote_demote(user)

    def shortlist(self, user: str | None) -> None:
        """Keep the shortlisted candidates that have not failed (their evidence stands), and fill
        the free places with the user's newest short complaints, then the bank's nearest to their
        recent complaints: a shortlist that churned with every complaint would waste its tries."""
        complaints = self.store.reactions_of(user, limit=MEMORY_READ, score=-1)
        texts = [r["text"] for r in complaints if r["text"].strip()]
        if not texts:
            return
        known = {r["text"]: r for r in self.store.preferences_of(user)}
        w = self.cfg.abstain_weight
        kept = [r for r in known.values() if r["status"] == "candidate" and r["shortlisted"] and not failed(r, w)]
        taken = {r["text"] for r in kept}

        def free(text: str) -> bool:
            row = known.get(text)
            return text not in taken and (row is None or (row["status"] == "candidate" and not failed(row, w)))

        said: list[str] = []
        hinted = self._hinted([int(r["turn_id"]) for r in complaints])
        for r in complaints:
            cand = said_instruction(r["text"], self.cfg.said_max_words) if int(r["turn_id"]) in hinted else None
            if cand and cand not in said and free(cand):
                said.append(cand)
        if self.chooser is None:
            self.chooser = InstructionChooser(embed=self.embed, shortlist=self.cfg.shortlist * 4)
        near = self.chooser.diverse(texts, self.cfg.shortlist, taken=[r["text"] for r in kept] + said[:SAID_KEPT],
                                    novelty=NOVELTY, allowed=free)
        best = max([s for s, _ in near] + [float(r["prior"]) for r in kept], default=1.0)
        room = self.cfg.shortlist - len(kept)
        # the user's own words first (at most SAID_KEPT of the places), then the bank by similarity
        fresh = [(x, "said", best) for x in said[:SAID_KEPT]] + [(x, "bank", float(sim)) for sim, x in near]
        items = [(r["text"], r["source"], float(r["prior"])) for r in kept] + fresh[: max(room, 0)]
        self.store.set_shortlist(user, items)

    def _hinted(self, turn_ids: list[int]) -> set[int]:
        """Of these turns, those whose judgment carries a hint (the reply said what to change)."""
        return {t for t, h in self.store.judgment_hints(turn_ids).items() if h}

    def promote_demote(self, user: str | None) -> None:
        untried = untried_evidence(self.store.untried_scores(user, self.cfg.baseline_window), self.cfg.abstain_weight)
        for row in self.store.preferences_of(user, ("candidate", "active")):
            if row["status"] == "candidate" and row["shortlisted"] and promotable(row, untried, self.cfg):
                self.store.set_preference_status(row["id"], "active")
                log.info("user %s: preference found after %d tries (%d good, %d bad): %s",
                         user, row["tries"], row["good"], row["bad"], row["text"])
            elif row["status"] == "active":
                served = self.store.served_under(row["id"], self.cfg.demote_window * 2, since=row["activated_at"])
                scores = [r["score"] for r in served if r["score"] != 0][: self.cfg.demote_window]
                if sum(s == -1 for s in scores) < self.cfg.demote_bad:
                    continue
                if row["absorbed"]:
                    self.store.set_preference_status(row["id"], "active")  # back in the prompt, a new window
                    log.info("user %s: replies turned bad without the prompt; serving it again: %s", user, row["text"])
                else:
                    self.store.set_preference_status(row["id"], "demoted")
                    log.info("user %s: preference demoted, its replies turned bad: %s", user, row["text"])
