"""Learning by trying, the proxy's half: which instruction, if any, a chat request is served under.

A small model cannot infer the rule behind "too dense to read", but told plainly it follows it. So
when a user has complained and no preference is found yet, or one of their recent replies was
judged unhappy (or the judge abstained on a complaint), their next answer is generated under one of
their candidate instructions (``judge/trying.py`` keeps the shortlist and the evidence), chosen by
Thompson sampling over each candidate's good and bad replies; an active preference is applied to
every answer (``trying.apply``: prompt or both). The instruction goes to the upstream only, through
``clawproxy.instruct.add_hint``, after the system prompt and the earlier turns, so the engine's
prefix cache keeps them; the client gets the answer as usual, and the turn records what it was
served under.

Never tried: ``x-clawproxy-learn: off`` traffic, side requests, a request answering a tool's
result, a user who turned it off (``clawproxy users trying NAME off``), or anyone with
``trying.enabled: false``; each user's tries are bounded by ``trying.max_share`` and
``trying.max_tries``. The state is read by the proxy's poller (``poller.py``), never on the request
path; a request decides in memory. ``Trying`` is an addon: its ``rewrite`` hook runs after routing's
(``addons.default_addons``), so the instruction rides on the routed model.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clawproxy.config import Config
from clawproxy.instruct import add_hint
from clawproxy.proxy.sessions import classify
from clawproxy.proxy.wire import Outgoing
from clawproxy.store.lifecycle import LEARN_HEADER

if TYPE_CHECKING:
    from clawproxy.store import Store

SHARE_HORIZON = 36  # tries may come early: a budget of max_share over this many turns from the start


@dataclass(frozen=True, slots=True)
class Served:
    """What one request was served under: the text added to its prompt, the candidate tried (None:
    none), the active preferences applied, and the role (try: a candidate was tried; apply: only
    preferences)."""

    text: str
    tried: int | None
    applied: tuple[int, ...]
    role: str


@dataclass(slots=True)
class UserPlan:
    """One user's state as the last poll read it."""

    active: list[dict[str, Any]] = field(default_factory=list)
    candidates: list[dict[str, Any]] = field(default_factory=list)
    unhappy: bool = False
    turns: int = 0
    tried: int = 0
    off: bool = False


def eligible(obj: dict[str, Any], headers: Mapping[str, str]) -> bool:
    """Whether this chat request may get an instruction: learned from, a main turn, not answering a tool."""
    if str(headers.get(LEARN_HEADER, "")).strip().lower() == "off":
        return False
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
        return False
    if classify(obj, bool(obj.get("stream"))) is not None:
        return False
    real = [m for m in messages if isinstance(m, dict) and m.get("role") in ("user", "assistant", "tool")]
    return bool(real) and real[-1].get("role") == "user"


class Trying:
    """Chooses each eligible request's instruction from the polled plans (module docstring)."""

    def __init__(self, cfg: Config, rng: random.Random | None = None):
        self.tcfg = cfg.trying
        self.plans: dict[str | None, UserPlan] = {}
        self.rng = rng or random.Random()
        self.pulled: set[int] = set()  # candidates this process has served a try of

    def budget_left(self, plan: UserPlan) -> bool:
        t = self.tcfg
        if plan.tried >= t.max_tries:
            return False
        return plan.tried + 1 <= t.max_share * max(plan.turns + 1, SHARE_HORIZON)

    def pick(self, candidates: list[dict[str, Any]]) -> dict[str, Any]:
        """Each candidate once first, nearest to the complaints first (as sequential halving gives
        every arm a pull before it narrows: TRIPLE, arXiv 2402.09723); then Thompson sampling: each
        candidate's Beta(good, bad) draw, abstentions at ``trying.abstain_weight`` by their majority,
        the shortlist's prior as one extra good reply at most."""
        fresh = [c for c in candidates if not int(c["tries"]) and int(c["id"]) not in self.pulled]
        if fresh:  # tries count once judged, a turn later: the ones served since are remembered here
            return max(fresh, key=lambda c: float(c["prior"]))
        top = max((float(c["prior"]) for c in candidates), default=0.0) or 1.0
        w = self.tcfg.abstain_weight
        draws = [(self.rng.betavariate(
            1 + int(c["good"]) + w * int(c.get("leaned_good", 0)) + max(float(c["prior"]), 0.0) / top,
            1 + int(c["bad"]) + w * int(c.get("leaned_bad", 0))), c) for c in candidates]
        return max(draws, key=lambda d: d[0])[1]

    def choose(self, user: str | None) -> Served | None:
        plan = self.plans.get(user)
        if plan is None:
            return None
        applied = [p for p in plan.active if self.tcfg.apply == "prompt"
                   or (self.tcfg.apply == "both" and not p["absorbed"])]
        tried = None
        if (self.tcfg.enabled and not plan.off and plan.unhappy and plan.candidates
                and self.budget_left(plan)):
            tried = self.pick(plan.candidates)
            self.pulled.add(int(tried["id"]))
        if tried is None and not applied:
            return None
        texts = [p["text"] for p in applied] + ([tried["text"]] if tried else [])
        return Served(text=" ".join(_sentence(x) for x in texts), tried=int(tried["id"]) if tried else None,
                      applied=tuple(int(p["id"]) for p in applied), role="try" if tried else "apply")

    def rewrite(self, req: Outgoing) -> None:
        """The addon hook: this user's instruction in the last user message of an eligible chat
        request, and what it was on ``req.served``; nothing when nothing applies."""
        obj = req.obj
        plan = self.plans.get(req.user)
        if not req.chat or obj is None or plan is None or not eligible(obj, req.headers):
            return
        plan.turns += 1  # counted now: the next poll would be a second late for a burst
        served = self.choose(req.user)
        if served is None:
            return
        if served.tried is not None:
            plan.tried += 1
        req.set("messages", add_hint(obj["messages"], served.text))
        req.served = served

    def read(self, store: Store) -> None:
        """The poller's read (a thread: SQLite blocks): every user's preferences, candidates and
        recent verdicts."""
        plans: dict[str | None, UserPlan] = {}
        for row in store.serving_preferences():
            plan = plans.setdefault(row["user"], UserPlan())
            (plan.active if row["status"] == "active" else plan.candidates).append(row)
        off = set(store.users_not_tried())
        window = self.tcfg.unhappy_window
        for user, plan in plans.items():
            # unsure counts: an abstention whose majority complained is reason enough to try
            recent = store.recent_scores(user, window)
            plan.unhappy = not plan.active or any(r["score"] == -1 or r["majority"] == -1 for r in recent)
            counts = store.trying_counts(user)
            plan.turns, plan.tried = int(counts["turns"]), int(counts["counted"])
            plan.off = user in off
        self.plans = plans


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."
