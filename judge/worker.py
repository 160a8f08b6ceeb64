"""The judge worker: score every trainable main turn that has a next state, once.

Loop: pick turns (kind main, trainable, next state present, no judgment row), cast m votes outside
any transaction (voting is slow), then write every vote and the judgment in ONE transaction that
first re-checks that no judgment exists (``Store.record_judgment``). So:

- a crash (or SIGKILL) mid-turn leaves nothing behind for that turn: it is picked up again later;
- two workers racing on one turn cannot both write it (BEGIN IMMEDIATE + the re-check, backed by
  the judgments primary key and UNIQUE(turn_id, idx) on votes);
- a vote that raises is not a verdict: the turn is retried on a later poll with backoff, and only
  after ``max_attempts`` are the raising votes recorded as failed votes, so a broken turn cannot
  block the queue forever. Expected failures (an LLM answer in the wrong format) are failed votes
  right away.

The worker runs standalone (``clawproxy judge run``) or under ``clawproxy start`` (the supervisor
spawns ``clawproxy judge run --follow``); either way it only reads and writes the store, so it
never slows the proxy.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from clawproxy.stop import Stoppable
from clawproxy.store import Store
from judge.extract import JudgeInput, from_turn
from judge.hints import corrective_part
from judge.trying import asks_for_change
from judge.voters import HintWriter, MemoryHints, Vote, Voter, cast, combine, final_hint

log = logging.getLogger(__name__)


@dataclass
class _Retry:
    attempts: int
    not_before: float


@dataclass
class Worker:
    store: Store
    voter: Voter
    votes: int = 3
    batch_size: int = 16
    max_attempts: int = 3
    backoff_s: float = 2.0
    hint_writer: HintWriter | MemoryHints | None = None
    memory_size: int = 3  # replies a memory hint reads: this one and the user's earlier complaints
    min_confidence: float = 0.0  # a ±1 majority less sure than this scores 0 (judge.voters.combine)
    trier: Any = None  # judge.trying.Trier: the user's candidates and preferences after each judgment
    judged: int = 0
    _retry: dict[int, _Retry] = field(default_factory=dict)

    def cast_votes(self, turn: dict[str, Any], final_attempt: bool) -> list[Vote] | None:
        """m votes, or None if a vote raised and the turn should be retried later."""
        inp = from_turn(turn)
        try:
            return cast(self.voter, inp, self.votes)
        except Exception as e:
            log.warning("judge: voter %s raised on turn %s: %s: %s",
                        self.voter.name, turn["id"], type(e).__name__, e)
            if not final_attempt:
                return None
            return [Vote(None, error=f"{type(e).__name__}: {e}")] * self.votes

    def written_hint(self, turn: dict[str, Any], votes: list[Vote]) -> str | None:
        """The hint writer's instruction for a -1 turn, or None (no writer, nothing to change, or
        the writer failed: then the voters' own hint stands, and the turn is not held back)."""
        if self.hint_writer is None or combine(votes, self.min_confidence).score != -1:
            return None
        try:
            memory: list[str] = []
            if self.hint_writer.reads_memory and self.memory_size > 1:
                memory = [r["text"] for r in self.store.reactions_of(
                    turn.get("user"), limit=self.memory_size - 1, score=-1, before_turn=int(turn["id"]))]
            return self.hint_writer.write(from_turn(turn), memory)
        except Exception as e:
            log.warning("judge: hint writer failed on turn %s, keeping the voters' hint: %s: %s",
                        turn["id"], type(e).__name__, e)
            return None

    def write(self, turn_id: int, votes: list[Vote], hint: str | None = None,
              inp: JudgeInput | None = None) -> int | None:
        """Write the votes, the judgment and the user's reaction (to their memory) atomically;
        None if the turn was judged meanwhile."""
        verdict = combine(votes, self.min_confidence)
        score, majority = verdict.score, verdict.majority
        reaction, remembered = reaction_text(inp), None
        if score != -1 and reaction and asks_for_change(reaction):
            # "can you rewrite that so I can scan it" is never praise: no sample, but it leans
            # unhappy and the user's memory keeps it as a complaint (their words for what to change)
            score, majority, remembered = 0, -1, -1
        hint = (hint if score == -1 else None) or final_hint(votes, score)
        written = self.store.record_judgment(
            turn_id, score=score, hint=hint, voter=self.voter.name,
            votes=[{k: v for k, v in asdict(vote).items() if k != "probs"} for vote in votes],
            majority=majority, confidence=verdict.confidence, reaction=reaction, reaction_score=remembered)
        return score if written else None

    def judge_turn(self, turn: dict[str, Any]) -> int | None:
        """Judge one turn; returns the score written, or None (retry later / already judged)."""
        tid = int(turn["id"])
        retry = self._retry.get(tid)
        attempt = (retry.attempts if retry else 0) + 1
        try:
            votes = self.cast_votes(turn, final_attempt=attempt >= self.max_attempts)
        except Exception as e:  # building the input failed: same policy as a raising voter
            log.warning("judge: turn %s could not be prepared: %s: %s", tid, type(e).__name__, e)
            votes = None if attempt < self.max_attempts else [Vote(None, error=f"{type(e).__name__}: {e}")] * self.votes
        if votes is None:
            delay = min(self.backoff_s * 2 ** (attempt - 1), 300.0)
            self._retry[tid] = _Retry(attempt, time.monotonic() + delay)
            return None
        self._retry.pop(tid, None)
        try:
            inp: JudgeInput | None = from_turn(turn)
        except Exception:  # a turn that cannot be read is judged by its failed votes, with no memory
            inp = None
        score = self.write(tid, votes, self.written_hint(turn, votes), inp)
        if score is not None:
            self.judged += 1
            self.after_judgment(turn, score)
        return score

    def after_judgment(self, turn: dict[str, Any], score: int) -> None:
        """Learning by trying's bookkeeping; its failure never holds a judgment back."""
        if self.trier is None:
            return
        try:
            self.trier.after_judgment(turn, score, None)
        except Exception:
            log.exception("judge: updating user %s's candidates after turn %s failed", turn.get("user"), turn["id"])

    def run_once(self, limit: int | None = None, progress: Callable[[int], Any] | None = None,
                 stop: Stoppable | None = None) -> int:
        """Judge the pending turns (up to ``limit``); returns how many were written."""
        written = 0
        while limit is None or written < limit:
            now = time.monotonic()
            waiting = {t for t, r in self._retry.items() if r.not_before > now}
            n = self.batch_size if limit is None else min(self.batch_size, limit - written)
            turns = self.store.unjudged_turns(n, exclude=waiting)
            if not turns:
                break
            for turn in turns:
                if stop is not None and stop.is_set():
                    return written
                if self.judge_turn(turn) is not None:
                    written += 1
                    if progress is not None:
                        progress(1)
                if limit is not None and written >= limit:
                    break
            if all(t["id"] in self._retry for t in turns):
                break  # everything left is backing off; let the caller sleep
        if written:
            log.info("judged %d turn(s) with %s (m=%d); %d in total", written, self.voter.name,
                     self.votes, self.judged)
        return written

    def run(self, follow: bool, poll_interval_s: float, stop: Stoppable,
            limit: int | None = None, progress: Callable[[int], Any] | None = None) -> int:
        """One pass, or with ``follow`` poll until ``stop`` is set (SIGTERM) or ``limit`` is reached."""
        total = 0
        while not stop.is_set():
            left = None if limit is None else limit - total
            total += self.run_once(left, progress=progress, stop=stop)
            if limit is not None and total >= limit:
                break
            if not follow:
                if not self._retry:
                    break
                # One pass still owes the turns that are backing off: wait for the earliest.
                wait = max(0.0, min(r.not_before for r in self._retry.values()) - time.monotonic())
                stop.wait(wait)
                continue
            stop.wait(poll_interval_s)
        return total


MAX_REACTION = 500


def reaction_text(inp: JudgeInput | None) -> str | None:
    """What the user said about the answer, for their memory: the reply up to where it moves on to
    the next request. None for a tool's output or an empty reply."""
    if inp is None or inp.role != "user" or not inp.next_state.strip():
        return None
    text = corrective_part(inp.next_state, inp.request).strip()
    return text[: MAX_REACTION - 1].rstrip() + "…" if len(text) > MAX_REACTION else text
