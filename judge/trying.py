"""Learning by trying, the judge's half: after each judgment, a user's candidates and preferences.

The proxy serves an unhappy user's next answers under candidate instructions (``clawproxy/proxy/
trying.py``); the judge's sign on each such reply is counted as that candidate's evidence in the
judgment's own transaction (``Store.record_judgment``). Here, after a judgment:

- **shortlist**: after a complaint, the user's shortlisted candidates that have not failed stay
  (failed: two more bad replies than good, or after two tries answers that broke or whose form did
  not move), and the free places go to up to two short complaints of their own that ask for
  something, rewritten as an instruction ("could I have it as a table" -> "Give the answer as a
  table."; not "I can never find the part I need"), then to the bank's instructions
  (``judge/data/instructions.txt``) near their recent complaints by sentence embedding and unlike
  each other (maximal marginal relevance over the nearest four times the shortlist);
- **promote**: a candidate becomes an active preference when its replies are likely liked more often
  than the user's untried ones: P(θ_candidate > θ_untried) >= ``promote_confidence`` under Beta
  posteriors (one wrong sign from the judge does not block a candidate the user plainly prefers),
  and its answers changed form away from those the user complained about (``judge/features.py``:
  a judge's wrong sign cannot promote an instruction that changed nothing) and are real answers;
- **demote**: an active preference whose answers are mostly broken is demoted; one whose last
  ``demote_window`` scored replies hold ``demote_bad`` bad ones goes back into the prompt if the
  adapter had absorbed it, else is demoted.

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
from clawproxy.degenerate import answer_flaw
from clawproxy.store import Store
from judge.features import moved
from judge.hints import InstructionChooser

log = logging.getLogger(__name__)

FORM_READ = 6  # answers read to see what a candidate changed
FORM_TRIES = 2  # tries after which a candidate that changed nothing, or broke answers, leaves the shortlist
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
_PLEASE = re.compile(r"\b(?:please|pls|plz)\b", re.IGNORECASE)
# The common request forms, each rewritten as an instruction: "can you X" -> "X", "could I get X" /
# "I'd like X" -> "Give X", "I'd like you to X" -> "X".
_ASK_YOU = re.compile(r"^(?:can|could|would|will)\s+(?:you|u)\s+(?:please\s+)?(?P<rest>.+)$", re.IGNORECASE)
_ASK_ME = re.compile(r"^(?:can|could|may)\s+i\s+(?:please\s+)?(?:get|have|see)\s+(?P<rest>.+)$", re.IGNORECASE)
_WANT = re.compile(r"^(?:i'?d|i\s+would)\s+(?:really\s+)?(?:like|prefer|love)\s+(?P<rest>.+)$"
                   r"|^i\s+(?:just\s+|really\s+)?(?:want|need|prefer)\s+(?P<rest2>.+)$", re.IGNORECASE)
# a new sentence that asks a question, with no stop before it ("shorter please What is a lease?")
_NEW_QUESTION = re.compile(r"(?<=[a-z,])\s+(?=(?:How|What|Why|Where|When|Who|Which|Whose|Is|Are|Do|Does|Did|Can|Could|"
                           r"Should|Would|Will|Was|Were|Has|Have)\b)")
_QUESTION_WORD = re.compile(r"^(?:how|what|why|where|when|who|which|whose|is|are|do|does|did|was|were|has|have)\b",
                            re.IGNORECASE)
_LEAD = re.compile(r"^(?:ok(?:ay)?|hey|hm+|um+|ugh|so|well|sorry|oh|and|but)\b[\s,.!]*", re.IGNORECASE)
_THAT = re.compile(r"\b(?:that|it|this)\b", re.IGNORECASE)
# verbs whose "it"/"that" is the answer the user replied to
_ON_THE_ANSWER = frozenset("give make put keep reformat rewrite redo do trim break format cut shorten split".split())


def _as_instruction(clause: str) -> str | None:
    """One clause as an instruction, or None when it asks for nothing."""
    c = _LEAD.sub("", " ".join(_PLEASE.sub("", clause).split())).strip().rstrip(" ?!.")
    if not c:
        return None
    if (m := _ASK_YOU.match(c)) is not None:
        c = m.group("rest")
    elif (m := _ASK_ME.match(c)) is not None:
        c = "give " + m.group("rest")
    elif (m := _WANT.match(c)) is not None:
        rest = m.group("rest") or m.group("rest2")
        if rest.lower().startswith("you to "):
            c = rest[len("you to "):]
        else:
            c = ("make " if _THAT.match(rest) else "give ") + rest
    elif not (c.split()[0].lower() in _REQUEST_START or _PLEASE.search(clause)):
        return None
    if c.split()[0].lower() in _ON_THE_ANSWER:
        c = _THAT.sub("the answer", c, count=1)
    return c[0].upper() + c[1:] + "."


def asks(text: str) -> bool:
    """Whether the reply asks for something ("shorter, please", "could I have it as a table",
    "ok. just give me the number"), rather than only describing a problem ("I can never find the
    part I need"): only a request is served back as an instruction."""
    if _PLEASE.search(text):
        return True
    return any(_as_instruction(cl) for cl in _CLAUSES.split(text))


def said_instruction(text: str, max_words: int) -> str | None:
    """The user's complaint rewritten as a candidate instruction ("could I have it as a table" ->
    "Give the answer as a table."), or None: too long, empty, not a request, or not about style."""
    text = " ".join(text.split()).strip()
    if not text or len(text.split()) > max_words or _NOT_STYLE.search(text) or not asks(text):
        return None
    clauses = [c for part in _NEW_QUESTION.split(text) for c in _CLAUSES.split(part) if c.strip()]
    first = next((i for i, c in enumerate(clauses) if _as_instruction(c)), None)
    if first is None:
        return None
    # the asking clause and what follows it ("split it up? one step per line"), less the filler
    # ("ok", "so") and a question that is the user's next task, not how to answer
    rest = [c for c in clauses[first:] if _LEAD.sub("", c).strip()
            and (_as_instruction(c) or not _QUESTION_WORD.match(c.strip()))]
    parts = [_as_instruction(c) or c.strip()[0].upper() + c.strip()[1:].rstrip(" ?!.") + "." for c in rest]
    return " ".join(parts)


def asks_for_change(reaction: str, max_words: int = 12) -> bool:
    """The reply asks the assistant to change something, in a request form ("can you rewrite that",
    "points please"): whatever a voter read in it, it is no praise."""
    return said_instruction(reaction, max_words) is not None


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
        if (score == -1 or self._asked(turn)) and self.cfg.enabled:
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
        kept = [r for r in known.values() if r["status"] == "candidate" and r["shortlisted"] and not failed(r, w)
                and not (r["tries"] >= FORM_TRIES and self.what_blocks(r, user))]
        taken = {r["text"] for r in kept}

        def free(text: str) -> bool:
            row = known.get(text)
            return text not in taken and (row is None or (row["status"] == "candidate" and not failed(row, w)))

        said: list[str] = []
        for r in complaints:
            cand = said_instruction(r["text"], self.cfg.said_max_words)
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

    def _asked(self, turn: dict[str, Any]) -> bool:
        """The user's memory keeps the turn's reply as a complaint (a request judged 0: ``Worker.write``)."""
        rows = self.store.reactions_of(turn.get("user"), limit=1, score=-1, before_turn=int(turn["id"]) + 1)
        return bool(rows) and int(rows[0]["turn_id"]) == int(turn["id"])

    def what_blocks(self, row: dict[str, Any], user: str | None) -> str | None:
        """Why a candidate's tried answers cannot make it a preference: 'broken' (most are no real
        answer: empty, looping, a word or two), 'unchanged' (their form did not move away from the
        answers the user complained about, ``judge/features.py``), else None."""
        tried = self.store.answers_under(row["id"], limit=FORM_READ, tried_only=True)
        if not tried:
            return None
        if sum(answer_flaw(a) is not None for a in tried) * 2 > len(tried):
            return "broken"
        complained = self.store.untried_answers(user, -1, FORM_READ)
        praised = self.store.untried_answers(user, 1, FORM_READ)
        if complained and not moved(tried, complained, praised, self.cfg.min_movement):
            return "unchanged"
        return None

    def promote_demote(self, user: str | None) -> None:
        untried = untried_evidence(self.store.untried_scores(user, self.cfg.baseline_window), self.cfg.abstain_weight)
        for row in self.store.preferences_of(user, ("candidate", "active")):
            if (row["status"] == "candidate" and row["shortlisted"] and promotable(row, untried, self.cfg)
                    and self.what_blocks(row, user) is None):
                self.store.set_preference_status(row["id"], "active")
                log.info("user %s: preference found after %d tries (%d good, %d bad): %s",
                         user, row["tries"], row["good"], row["bad"], row["text"])
            elif row["status"] == "active":
                answers = self.store.answers_under(row["id"], self.cfg.demote_window, since=row["activated_at"])
                if len(answers) >= 2 and sum(answer_flaw(a) is not None for a in answers) * 2 > len(answers):
                    self.store.set_preference_status(row["id"], "demoted")  # no preference that breaks answers stays
                    log.info("user %s: preference demoted, its answers are no real answers: %s", user, row["text"])
                    continue
                served = self.store.served_under(row["id"], self.cfg.demote_window * 2, since=row["activated_at"])
                # an abstention counts by its lean: a request for a change is scored 0 leaning bad
                scores = [s for r in served if (s := r["score"] or r["majority"] or 0)][: self.cfg.demote_window]
                if sum(s == -1 for s in scores) < self.cfg.demote_bad:
                    continue
                if row["absorbed"]:
                    self.store.set_preference_status(row["id"], "active")  # back in the prompt, a new window
                    log.info("user %s: replies turned bad without the prompt; serving it again: %s", user, row["text"])
                else:
                    self.store.set_preference_status(row["id"], "demoted")
                    log.info("user %s: preference demoted, its replies turned bad: %s", user, row["text"])
