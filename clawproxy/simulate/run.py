"""The full-system simulation: a persona talks to `clawproxy start`, the curve is measured as it learns.

The loop: conversations of a few turns through the proxy (recorded, judged, trained on, weights
hot-reloaded by the other components), and every ``eval_every`` interactions a measurement pass
against the engine's currently served weights. Before measuring, the run lets the pipeline settle
(judge caught up, trainer's queue below one batch, latest checkpoint served) so the curve compares
learning per interaction with the synchronous oracle baseline rather than CPU scheduling luck; the
wall time is reported beside it.

``oracle=True`` replaces the judge with the persona's own check: the run writes each turn's
judgment (+1 met / -1 not, the preference as hint) into the store itself, so the trainer learns
from a perfect reward through the same proxy, store and reload path.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from clawproxy.engine_spec import engine_spec
from clawproxy.simulate.driver import (
    Completion,
    Driver,
    DriverSettings,
    Interaction,
    answer_heldout,
    cycle_prompts,
)
from clawproxy.simulate.measure import Curve, CurvePoint, atomic_write, make_point, score_answers
from clawproxy.simulate.peers import CAPABILITY_TASKS, capability_right, effort, streak, told_prompt
from clawproxy.simulate.personas import ScriptedPersona, make_persona
from clawproxy.simulate.prompts import (
    HELDOUT_PROMPTS,
    SYSTEM_PROMPT,
    TRAIN_PROMPTS,
    VALIDATION_PROMPTS,
)
from clawproxy.simulate.quality import ON_TOPIC_MIN

log = logging.getLogger("clawproxy.simulate")

BASE_ANSWERS = Path.home() / ".cache" / "clawproxy" / "simulate"


@dataclass
class SimSettings:
    proxy_url: str = "http://127.0.0.1:8080"
    eval_url: str | None = None  # engine base URL; None: through the proxy, a session per answer
    data_dir: str | None = None  # the store to read judge scores from (and write oracle judgments to)
    persona: str = "concise"
    interactions: int = 36
    eval_every: int = 12
    turns_per_conversation: int = 3
    max_tokens: int = 512  # max_completion_tokens per turn
    eval_max_tokens: int = 160
    temperature: float = 0.7
    seed: int = 0
    model: str = "default"  # the model id the user's client names (the engine's served name)
    engine_kind: str = "embedded"  # engine.kind: its spec says whether held-out answers name the adapter
    adapter: str = "clawproxy"  # vLLM's name for the trainer's LoRA adapter
    oracle: bool = False
    settle: bool = True
    settle_timeout_s: float = 600.0
    settle_stall_s: float = 180.0
    trainer_batch_size: int = 4
    on_topic_min: float = ON_TOPIC_MIN
    label: str = ""
    llm_persona_url: str | None = None
    llm_persona_model: str = "default"
    feedback: str | None = None  # feedback bank (YAML); None: the shipped natural bank
    eval_prompts: str = "heldout"  # 'validation' while tuning; 'heldout' only for the reported curve
    peers: bool = True  # capability (base and last point) and the told baseline beside adoption
    short_is_broken: bool = True  # the simulated user calls a word or two no answer (False: as before 2026-12)
    engine_id: str = ""  # the engine's kind, model, dtype and quantization: the base's answers are kept per engine
    method: str = ""  # informational (the trainer's method), recorded in the curve
    extra: dict[str, Any] = field(default_factory=dict)


class StoreView:
    """What the simulator reads from (and, as the oracle, writes to) the clawproxy store."""

    def __init__(self, data_dir: str | Path) -> None:
        from clawproxy.store import Store

        self.store = Store(Path(data_dir) / "clawproxy.db")

    def close(self) -> None:
        self.store.close()

    @staticmethod
    def _in(sessions: list[str]) -> tuple[str, list[str]]:
        return ",".join("?" * len(sessions)), list(sessions)

    def main_turns(self, session_id: str) -> list[dict[str, Any]]:
        return self.store.main_turns_scored(session_id)

    def judge_summary(self, sessions: list[str]) -> tuple[float | None, int]:
        """Mean judge score and count over these sessions' judged turns."""
        if not sessions:
            return None, 0
        rows = []
        for sid in sessions:
            rows += [r["score"] for r in self.main_turns(sid) if r["score"] is not None]
        return (sum(rows) / len(rows) if rows else None), len(rows)

    def backlog(self, sessions: list[str]) -> dict[str, int]:
        """Work the pipeline still has on this run's turns, and the published weight version."""
        unjudged = unconsumed = pending = 0
        for sid in sessions:
            for r in self.main_turns(sid):
                if r["reason"] == "pending":
                    pending += 1
                if not r["trainable"]:
                    continue
                if r["score"] is None:
                    unjudged += 1
                    continue
                fate = self.store.training_fate([r["id"]])[r["id"]]
                if fate["step"] is None and fate["skipped"] is None and r["score"] != 0:
                    unconsumed += 1
        return {"unjudged": unjudged, "unconsumed": unconsumed, "pending": pending,
                "published": self.store.latest_weight_version()}

    def published(self) -> tuple[int, str | None]:
        """The newest published version and its format ('lora', 'full'; None: the base model)."""
        row = self.store.serving_checkpoint()
        return (int(row["version"]), str(row["format"])) if row else (0, None)

    def _turn_rows(self, interactions: list[Interaction]) -> list[tuple[Interaction, dict[str, Any]]]:
        """Each interaction with its recorded main turn (a conversation's closing call has none)."""
        by_session: dict[str, list[Interaction]] = {}
        for it in interactions:
            by_session.setdefault(it.session_id, []).append(it)
        out = []
        for sid, its in by_session.items():
            out += list(zip(sorted(its, key=lambda x: x.turn), self.main_turns(sid), strict=False))
        return out

    def judge_agreement(self, interactions: list[Interaction]) -> dict[str, int]:
        """The judge's scores against the simulator's intended verdicts (+1 praised, -1 complained):
        right, zero (abstained), wrong (opposite sign), unjudged."""
        out = {"right": 0, "zero": 0, "wrong": 0, "unjudged": 0}
        for it, row in self._turn_rows(interactions):
            score = row["score"]
            key = ("unjudged" if score is None else "zero" if score == 0
                   else "right" if score == it.intended else "wrong")
            out[key] += 1
        return out

    def trying_report(self, interactions: list[Interaction], user: str | None = None) -> dict[str, Any]:
        """Learning by trying on this run: the share of answers tried, when a preference was found
        and what the user saw after it, the judge on the tried answers, the preferences with their
        evidence, and each train step's kl_behaviour and clip fraction."""
        rows = self._turn_rows(interactions)
        tried = [(it, r) for it, r in rows if r["instruction_role"] == "try"]
        prefs = self.store.preferences_of(user)
        found = min((p["activated_at"] for p in prefs if p["activated_at"] is not None and p["source"] != "manual"),
                    default=None)
        found_at = None if found is None else sum(1 for _, r in rows if r["created_at"] <= found)
        after = rows[found_at:] if found_at is not None else []
        judge = {"right": 0, "zero": 0, "wrong": 0, "unjudged": 0}
        for it, r in tried:
            score = r["score"]
            judge["unjudged" if score is None else "zero" if score == 0
                  else "right" if score == it.intended else "wrong"] += 1

        def real(pairs: list[tuple[Interaction, dict[str, Any]]]) -> float | None:
            return round(sum(it.problem is None for it, _ in pairs) / len(pairs), 3) if pairs else None

        def met(pairs: list[tuple[Interaction, dict[str, Any]]]) -> float | None:
            return round(sum(it.met for it, _ in pairs) / len(pairs), 3) if pairs else None

        steps = []
        for st in self.store.step_figures(user):
            m = st["metrics"] or {}
            steps.append({"status": st["status"], "samples": m.get("samples"),
                          "kl_behaviour": m.get("kl_behaviour"), "clip_frac": m.get("clip_frac"),
                          "opd_gap": m.get("opd_gap_mean"), "kinds": m.get("kinds")})
        return {
            "answers": len(rows), "tried": len(tried),
            "tried_share": round(len(tried) / len(rows), 3) if rows else None,
            "found_at": found_at,
            "tried_share_after_found": (round(sum(r["instruction_role"] == "try" for _, r in after) / len(after), 3)
                                        if after else None),
            "served_adoption": met(rows), "served_adoption_after_found": met(after),
            "judge_on_tried": judge,
            "real_answer_share": {"tried": real(tried),
                                  "untried": real([(it, r) for it, r in rows if r["instruction_role"] != "try"])},
            "preferences": [{k: p[k] for k in ("id", "text", "source", "status", "tries", "good", "bad",
                                               "leaned_good", "leaned_bad", "absorbed", "gap", "activated_at")} for p in prefs if p["tries"] or p["status"] == "active"],
            "steps": steps,
        }

    def sample_accounting(self, interactions: list[Interaction]) -> dict[str, int]:
        """What became of each interaction: trained (by sample objective: rl, rl_opd, opd), or why not
        (the trainer's skip reason, the recorder's reason for an untrainable turn, not judged yet,
        judged but not consumed yet)."""
        out: dict[str, int] = {}
        for _, row in self._turn_rows(interactions):
            fate = self.store.training_fate([row["id"]])[row["id"]]
            objective = fate["objective"]
            if objective is not None:
                key = f"trained:{objective}" if objective else "trained"
            elif not row["trainable"]:
                key = f"not_trainable:{row['reason'] or 'unknown'}"
            elif row["score"] is None:
                key = "unjudged"
            else:
                key = f"skipped:{fate['skipped']}" if fate["skipped"] else "waiting"
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))

    def write_oracle_judgments(self, interactions: list[Interaction], hint: str) -> int:
        """Judge this run's turns from the persona's own check; returns how many were written."""
        by_session: dict[str, list[Interaction]] = {}
        for it in interactions:
            by_session.setdefault(it.session_id, []).append(it)
        written = 0
        for sid, its in by_session.items():
            rows = self.main_turns(sid)
            for it, row in zip(sorted(its, key=lambda x: x.turn), rows, strict=False):
                if row["score"] is not None:
                    continue
                score = 1 if it.met else -1
                self.store.add_judgment(row["id"], score, None if it.met else hint, "oracle")
                written += 1
        return written


def base_answers_path(s: SimSettings, prompts: list[str]) -> Path | None:
    """Where the base model's greedy answers to ``prompts`` are kept for this engine (None: not kept)."""
    if not s.engine_id:
        return None
    key = json.dumps([s.engine_id, s.model, SYSTEM_PROMPT, s.eval_max_tokens, prompts]).encode()
    return BASE_ANSWERS / f"{hashlib.sha256(key).hexdigest()[:24]}.json"


def peer_measures(interactions: list[Interaction]) -> dict[str, Any]:
    """User effort per window and the streak, from the interactions in the order they happened."""
    conversations: dict[str, list[bool]] = {}
    for it in interactions:
        conversations.setdefault(it.session_id, []).append(it.met and it.problem is None)
    windows = effort([it.met for it in interactions])
    return {"effort": windows,  # complaints about the preference, per WINDOW interactions
            "effort_ratio": round(windows[-1] / windows[0], 3) if len(windows) > 1 and windows[0] else None,
            "complaints": effort([it.intended == 1 for it in interactions]),  # any complaint, broken answers too
            "streak_at": streak(list(conversations.values()))}


async def served_version(http: aiohttp.ClientSession, engine_url: str | None, kind: str = "embedded") -> int | None:
    if not engine_url or not engine_spec(kind).reports_weight_version:  # the trainer publishes after the load
        return None
    try:
        from clawproxy.engine.client import EngineClient

        return await asyncio.to_thread(EngineClient(engine_url).weight_version)
    except Exception:
        return None


async def simulate(s: SimSettings, on_point: Callable[[CurvePoint], None] | None = None,
                   on_interaction: Callable[[Interaction], None] | None = None) -> Curve:
    """Run one persona through the running system; returns the adoption curve."""
    persona: ScriptedPersona = make_persona(s.persona, seed=s.seed, llm_url=s.llm_persona_url,
                                            llm_model=s.llm_persona_model, feedback=s.feedback,
                                            short_is_broken=s.short_is_broken)
    eval_pool = {"heldout": HELDOUT_PROMPTS, "validation": VALIDATION_PROMPTS}.get(s.eval_prompts)
    if eval_pool is None:
        raise ValueError(f"eval_prompts={s.eval_prompts!r}: use 'heldout' or 'validation'")
    label = s.label or f"{s.method or 'system'}{'-oracle' if s.oracle else ''}"
    curve = Curve(label=label, persona=s.persona, method=s.method or "system", settings=asdict(s))
    view = StoreView(s.data_dir) if s.data_dir else None
    prompts = cycle_prompts(list(TRAIN_PROMPTS), s.seed)
    sessions: list[str] = []
    since_point: list[str] = []
    interactions: list[Interaction] = []
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as http:
        driver = Driver(DriverSettings(base_url=s.proxy_url, model=s.model, max_tokens=s.max_tokens,
                                       temperature=s.temperature,
                                       turns_per_conversation=s.turns_per_conversation), http)

        async def settle() -> None:
            if not (s.settle and view and sessions):
                return
            deadline = time.monotonic() + s.settle_timeout_s
            last_state, last_change = None, time.monotonic()
            while time.monotonic() < deadline:
                if s.oracle:
                    await asyncio.to_thread(view.write_oracle_judgments, interactions, persona.preference.hint)
                b = await asyncio.to_thread(view.backlog, sessions)
                served = await served_version(http, s.eval_url, s.engine_kind)
                state = (b["unjudged"], b["unconsumed"], b["published"], served)
                caught_up = served is None or served >= b["published"]
                if b["unjudged"] == 0 and b["unconsumed"] < s.trainer_batch_size and caught_up:
                    return
                if state != last_state:
                    last_state, last_change = state, time.monotonic()
                elif time.monotonic() - last_change > s.settle_stall_s:
                    log.warning("pipeline stalled at %s; measuring anyway", b)
                    return
                await asyncio.sleep(2.0)
            log.warning("settle timeout after %.0fs; measuring anyway", s.settle_timeout_s)

        async def ask(prompts: list[str], model: str) -> list[Completion]:
            if s.eval_url:
                return await answer_heldout(http, s.eval_url, prompts, model=model, system_prompt=SYSTEM_PROMPT,
                                            max_tokens=s.eval_max_tokens, seed=s.seed)
            return await answer_heldout(http, s.proxy_url, prompts, model=s.model, system_prompt=SYSTEM_PROMPT,
                                        max_tokens=s.eval_max_tokens, seed=s.seed, via_proxy=True)

        async def measure(done: int, last: bool = False) -> None:
            await settle()
            held = list(eval_pool)
            model, version = s.model, None
            if engine_spec(s.engine_kind).adapters_by_name and view is not None:
                # straight to vLLM: name what the proxy would route to, and read its version
                version, format = await asyncio.to_thread(view.published)
                model = s.adapter if format == "lora" else s.model
            comps = await ask(held, model)
            graded = await asyncio.to_thread(score_answers, held, [c.text for c in comps],
                                             persona.check, s.on_topic_min,
                                             [c.finish_reason == "length" for c in comps])
            versions = [c.weight_version for c in comps if c.weight_version is not None]
            if version is not None and not versions:
                versions = [version]
            score, judged = (None, 0)
            if view:
                score, judged = await asyncio.to_thread(view.judge_summary, since_point)
            point = make_point(done, graded, max(versions) if versions else None,
                               time.monotonic() - t0, s.on_topic_min, score, judged)
            curve.points.append(point)
            since_point.clear()
            if s.peers and (done == 0 or last):
                await measure_peers(model, held, done == 0)
            if on_point:
                on_point(point)

        async def ask_base(prompts: list[str]) -> list[Completion]:
            """The base model's greedy answers, kept per engine: every seed's would be the same."""
            path = base_answers_path(s, prompts)
            if path is not None and path.exists():
                return [Completion(t, f, 0, 0.0) for t, f in json.loads(path.read_text())]
            comps = await ask(prompts, s.model)
            if path is not None:
                atomic_write(path, json.dumps([[c.text, c.finish_reason] for c in comps]).encode())
            return comps

        async def measure_peers(model: str, held: list[str], base: bool) -> None:
            """Capability on every call (the base's first); the told baseline on the base model alone."""
            tasks = list(CAPABILITY_TASKS)
            prompts = [t.prompt for t in tasks]
            answers = await (ask_base(prompts) if base else ask(prompts, model))
            right = await asyncio.to_thread(capability_right, tasks, [c.text for c in answers])
            cap = curve.peers.setdefault("capability", {"tasks": len(tasks)})
            cap["base" if base else "final"] = sum(right)
            cap["base_right" if base else "final_right"] = right
            if base:
                told = await ask_base([told_prompt(p, persona.preference.hint) for p in held])
                graded = await asyncio.to_thread(score_answers, held, [c.text for c in told], persona.check,
                                                 s.on_topic_min, [c.finish_reason == "length" for c in told])
                curve.peers["told"] = make_point(0, graded, None, 0.0, s.on_topic_min).adoption
                curve.peers["told_words"] = round(statistics.fmean([g.words for g in graded]), 1) if graded else None

        await measure(0)
        done = 0
        while done < s.interactions:
            n = min(s.turns_per_conversation, s.interactions - done)
            questions = [next(prompts) for _ in range(n)]
            its = await driver.converse(persona, questions)
            sessions.append(its[0].session_id)
            since_point.append(its[0].session_id)
            interactions.extend(its)
            for it in its:
                if on_interaction:
                    on_interaction(it)
            if s.oracle and view:
                await asyncio.to_thread(view.write_oracle_judgments, interactions, persona.preference.hint)
            prev, done = done, done + n
            if done // s.eval_every > prev // s.eval_every or done == s.interactions:
                await measure(done, last=done == s.interactions)
    if view:
        if not s.oracle:
            curve.judge_agreement = await asyncio.to_thread(view.judge_agreement, interactions)
        curve.samples = await asyncio.to_thread(view.sample_accounting, interactions)
        curve.trying = await asyncio.to_thread(view.trying_report, interactions)
        view.close()
    curve.peers.update(peer_measures(interactions))
    curve.wall_s = round(time.monotonic() - t0, 1)
    curve.settings["train_met_rate"] = (sum(i.met for i in interactions) / len(interactions)) if interactions else None
    return curve
