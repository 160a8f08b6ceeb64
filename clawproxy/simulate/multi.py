"""Several simulated users on one server (`clawproxy simulate --users concise,concise,bullets`).

Each persona is a user of the proxy (`clawproxy users add`'s rows: a key, only its keyed hash
stored), talks with their own key, and so trains their own adapter (``clawproxy-u-<name>``). The
conversations are interleaved round-robin, one conversation per user in turn, so the trainer sees
every owner's turns arrive together. At 0 and every ``eval_every`` interactions (each user's count)
the run settles (judge caught up, every owner's trainer queue below a batch, the newest checkpoint
served) and measures each user against the adapter that serves them (``Store.adapter_for``).

Cross-talk: each user's held-out answers are also scored with the other personas' checks (concise
against bullets and back), beside the same check on the base model's answers at point 0: a user's
adapter that moves another person's preference shows up there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp

from clawproxy.engine_spec import engine_spec
from clawproxy.errors import ConfigError
from clawproxy.simulate.driver import (
    Completion,
    Driver,
    DriverSettings,
    Interaction,
    answer_heldout,
    cycle_prompts,
)
from clawproxy.simulate.measure import Curve, CurvePoint, adoption_with, make_point, score_answers
from clawproxy.simulate.personas import ScriptedPersona, make_persona, preference_of
from clawproxy.simulate.prompts import (
    HELDOUT_PROMPTS,
    SYSTEM_PROMPT,
    TRAIN_PROMPTS,
    VALIDATION_PROMPTS,
)
from clawproxy.simulate.run import SimSettings, StoreView, served_version
from clawproxy.users import adapter_name

log = logging.getLogger("clawproxy.simulate")

# the preference each one is crossed with when the run has no other persona
OPPOSITE = {"concise": "bullets", "bullets": "concise"}


@dataclass
class SimUser:
    name: str
    persona: str
    key: str
    shared: bool = False


def parse_users(spec: str) -> list[str]:
    """``concise,concise,bullets`` (or persona file paths) -> the personas, in order; a ConfigError names a bad one."""
    personas = [p.strip() for p in spec.split(",") if p.strip()]
    if not personas:
        raise ConfigError("--users: give personas separated by commas, e.g. --users concise,concise,bullets.")
    for p in personas:
        try:
            preference_of(p)
        except ConfigError as e:
            raise ConfigError(f"--users: {e.message}") from e
    return personas


def user_names(personas: list[str]) -> list[str]:
    return [f"u{i}-{preference_of(p).name}" for i, p in enumerate(personas, 1)]


def add_users(data_dir: str | Path, personas: list[str], share: bool = False) -> list[SimUser]:
    """Store one user per persona as `clawproxy users add` does (keyed hash of a fresh key); the
    keys stay in memory for the drivers."""
    from clawproxy.store import Store
    from clawproxy.users import check_name, create

    store = Store(Path(data_dir) / "clawproxy.db")
    try:
        names = [check_name(n) for n in user_names(personas)]
        taken = [n for n in names if store.get_user(n) is not None]
        if taken:
            # their keys were printed once by an earlier run: a new run cannot talk as them
            raise ConfigError(f"user(s) {', '.join(taken)} already exist in {data_dir}; use a fresh --data-dir, "
                              f"or `clawproxy users remove NAME` first.")
        out = []
        for name, persona in zip(names, personas, strict=True):
            out.append(SimUser(name, persona, create(store, data_dir, name, shared=share), share))
        return out
    finally:
        store.close()


def cross_personas(own: str, run_personas: list[str]) -> list[str]:
    """The preferences a user's answers are also scored with: the run's other personas, else the opposite."""
    others = sorted(set(run_personas) - {own})
    return others or ([OPPOSITE[own]] if own in OPPOSITE else [])


class UsersView(StoreView):
    """StoreView plus what several users need: who serves whom, every owner's trainer queue."""

    def served_for(self, user: str, adapter: str = "clawproxy") -> tuple[int, str | None, str | None]:
        """(version, checkpoint format, vLLM name) serving ``user``: their own adapter, else the shared one if they
        share, else the base model (0, None, None)."""
        row = self.store.adapter_for(user)
        if row is None:
            return 0, None, None
        return int(row["version"]), str(row["format"]), adapter_name(row["user"], adapter)

    def queues(self, max_staleness: int) -> list[int]:
        """Each owner's useful candidates (a zero score never trains), what the trainer draws from."""
        out = []
        for owner in self.store.owners():
            rows = self.store.training_candidates(1_000_000, owner,
                                                  stale_below=self.store.stale_below(owner, max_staleness))
            out.append(sum(1 for r in rows if r["score"] != 0))
        return out

    def trained(self, user: str) -> int:
        return self.store.trained_count(user)


def _answers(comps: list[Completion]) -> tuple[list[str], list[bool]]:
    return [c.text for c in comps], [c.finish_reason == "length" for c in comps]


async def simulate_users(s: SimSettings, users: list[SimUser], *, max_staleness: int = 4,
                         on_point: Callable[[SimUser, CurvePoint], None] | None = None,
                         on_interaction: Callable[[SimUser, Interaction], None] | None = None) -> list[Curve]:
    """Run every user's persona through the running system, interleaved; a curve per user."""
    if not s.data_dir:
        raise ConfigError("several users need the system's data dir (their rows and the served adapters).")
    eval_pool = {"heldout": HELDOUT_PROMPTS, "validation": VALIDATION_PROMPTS}.get(s.eval_prompts)
    if eval_pool is None:
        raise ValueError(f"eval_prompts={s.eval_prompts!r}: use 'heldout' or 'validation'")
    run_personas = [u.persona for u in users]
    personas: dict[str, ScriptedPersona] = {
        u.name: make_persona(u.persona, seed=s.seed + i, llm_url=s.llm_persona_url,
                             llm_model=s.llm_persona_model, feedback=s.feedback)
        for i, u in enumerate(users)}
    cross = {u.name: cross_personas(u.persona, run_personas) for u in users}
    method = s.method or "system"
    curves = {u.name: Curve(label=u.name, persona=u.persona, method=method, user=u.name,
                            settings={**asdict(s), "user": u.name, "shared": u.shared, "oracle": s.oracle})
              for u in users}
    view = UsersView(s.data_dir)
    prompts = {u.name: cycle_prompts(list(TRAIN_PROMPTS), s.seed + i) for i, u in enumerate(users)}
    interactions: dict[str, list[Interaction]] = {u.name: [] for u in users}
    sessions: list[str] = []
    since_point: dict[str, list[str]] = {u.name: [] for u in users}
    held = list(eval_pool)
    t0 = time.monotonic()

    def write_oracle() -> None:
        for u in users:
            view.write_oracle_judgments(interactions[u.name], personas[u.name].preference.hint)

    async with aiohttp.ClientSession() as http:
        drivers = {u.name: Driver(DriverSettings(base_url=s.proxy_url, model=s.model, max_tokens=s.max_tokens,
                                                 temperature=s.temperature, api_key=u.key,
                                                 turns_per_conversation=s.turns_per_conversation), http)
                   for u in users}

        async def settle() -> None:
            if not (s.settle and sessions):
                return
            deadline = time.monotonic() + s.settle_timeout_s
            last_state, last_change = None, time.monotonic()
            while time.monotonic() < deadline:
                if s.oracle:
                    await asyncio.to_thread(write_oracle)
                b = await asyncio.to_thread(view.backlog, sessions)
                queues = await asyncio.to_thread(view.queues, max_staleness)
                published = [(await asyncio.to_thread(view.served_for, u.name, s.adapter))[0] for u in users]
                served = await served_version(http, s.eval_url, s.engine_kind)
                state = (b["unjudged"], tuple(queues), tuple(published), served)
                caught_up = served is None or served >= max(published, default=0)
                if b["unjudged"] == 0 and all(q < s.trainer_batch_size for q in queues) and caught_up:
                    return
                if state != last_state:
                    last_state, last_change = state, time.monotonic()
                elif time.monotonic() - last_change > s.settle_stall_s:
                    log.warning("pipeline stalled at unjudged %d, queues %s; measuring anyway", b["unjudged"], queues)
                    return
                await asyncio.sleep(2.0)
            log.warning("settle timeout after %.0fs; measuring anyway", s.settle_timeout_s)

        async def ask(model: str, key: str | None) -> list[Completion]:
            if key is None:  # straight to the engine: greedy answers depend on the weights only
                assert s.eval_url
                return await answer_heldout(http, s.eval_url, held, model=model, system_prompt=SYSTEM_PROMPT,
                                            max_tokens=s.eval_max_tokens, seed=s.seed)
            return await answer_heldout(http, s.proxy_url, held, model=s.model, system_prompt=SYSTEM_PROMPT,
                                        max_tokens=s.eval_max_tokens, seed=s.seed, via_proxy=True, api_key=key)

        async def measure(done: int) -> None:
            await settle()
            by_model: dict[str, list[Completion]] = {}  # users served the same weights get the same answers
            base: list[Any] | None = None  # the base model's graded answers (quality only; any check)
            if done == 0 and s.eval_url:
                by_model[s.model] = await ask(s.model, None)
                texts, cuts = _answers(by_model[s.model])
                base = await asyncio.to_thread(score_answers, held, texts, bool, s.on_topic_min, cuts)
            for u in users:
                version, format, name = await asyncio.to_thread(view.served_for, u.name, s.adapter)
                if s.eval_url:
                    # the name the proxy routes this user to (the embedded engine serves one set of weights)
                    model = name if engine_spec(s.engine_kind).adapters_by_name and format == "lora" and name else s.model
                    if model not in by_model:
                        by_model[model] = await ask(model, None)
                    comps = by_model[model]
                else:
                    model = name if format == "lora" and name else s.model  # what the proxy routes it to
                    comps = await ask(s.model, u.key)
                texts, cuts = _answers(comps)
                persona = personas[u.name]
                graded = await asyncio.to_thread(score_answers, held, texts, persona.check, s.on_topic_min, cuts)
                versions = [c.weight_version for c in comps if c.weight_version is not None]
                score, judged = await asyncio.to_thread(view.judge_summary, since_point[u.name])
                point = make_point(done, graded, max(versions) if versions else version,
                                   time.monotonic() - t0, s.on_topic_min, score, judged)
                point.served_by = model
                point.cross_talk = {o: adoption_with(graded, preference_of(o).check, s.on_topic_min)
                                    for o in cross[u.name]}
                curve = curves[u.name]
                if done == 0:
                    # through the proxy there is no asking the base model: point 0 of a fresh system is it
                    ref = graded if base is None else base
                    curve.cross_baseline = {o: adoption_with(ref, preference_of(o).check, s.on_topic_min)
                                            for o in cross[u.name]}
                    curve.settings["baseline"] = "base model" if base is not None else f"point 0 ({model})"
                curve.points.append(point)
                since_point[u.name].clear()
                if on_point:
                    on_point(u, point)

        await measure(0)
        done = 0
        while done < s.interactions:
            n = min(s.turns_per_conversation, s.interactions - done)
            for u in users:  # round-robin: one conversation each in turn
                questions = [next(prompts[u.name]) for _ in range(n)]
                its = await drivers[u.name].converse(personas[u.name], questions)
                # the proxy keeps a user's session as "<user>/<id>": the store's name for it
                its = [replace(it, session_id=f"{u.name}/{it.session_id}") for it in its]
                sessions.append(its[0].session_id)
                since_point[u.name].append(its[0].session_id)
                interactions[u.name].extend(its)
                for it in its:
                    if on_interaction:
                        on_interaction(u, it)
                if s.oracle:
                    await asyncio.to_thread(view.write_oracle_judgments, interactions[u.name],
                                            personas[u.name].preference.hint)
            prev, done = done, done + n
            if done // s.eval_every > prev // s.eval_every or done == s.interactions:
                await measure(done)
    try:
        for u in users:
            curve, its = curves[u.name], interactions[u.name]
            if not s.oracle:
                curve.judge_agreement = await asyncio.to_thread(view.judge_agreement, its)
            curve.samples = await asyncio.to_thread(view.sample_accounting, its)
            curve.trying = await asyncio.to_thread(view.trying_report, its, u.name)
            curve.trained = await asyncio.to_thread(view.trained, u.name)
            curve.settings["train_met_rate"] = (sum(i.met for i in its) / len(its)) if its else None
    finally:
        view.close()
    wall = round(time.monotonic() - t0, 1)
    for c in curves.values():
        c.wall_s = wall
    return list(curves.values())


def summary(curves: list[Curve]) -> dict[str, Any]:
    """Per user: adoption and cross-talk (against its baseline) at each point, samples trained."""
    return {"users": [{
        "user": c.user, "persona": c.persona, "shared": c.settings.get("shared"),
        "adoption": {p.interactions: p.adoption for p in c.points},
        "served_by": {p.interactions: p.served_by for p in c.points},
        "cross_talk": {o: {"baseline": base,
                           "at": {p.interactions: p.cross_talk.get(o) for p in c.points},
                           "vs_baseline": {p.interactions: round(p.cross_talk[o] - base, 4)
                                           for p in c.points if o in p.cross_talk}}
                       for o, base in c.cross_baseline.items()},
        "trained": c.trained, "judge_agreement": c.judge_agreement, "samples": c.samples, "wall_s": c.wall_s,
        "trying": c.trying,
    } for c in curves]}


def print_table(curves: list[Curve], console: Any = None) -> None:
    """user, persona, adoption at each point, cross-talk vs baseline at each point, trained, wall."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=200)
    xs = sorted({p.interactions for c in curves for p in c.points})
    table = Table(title="several users: held-out adoption at " + " / ".join(map(str, xs)) + " interactions",
                  title_justify="left")
    for col in ("user", "persona", "adoption", "other preference's adoption vs baseline", "trained", "wall (s)"):
        table.add_column(col, justify="right" if col in ("trained", "wall (s)") else "left")
    for c in curves:
        adoption = " / ".join(f"{p.adoption:.2f}" for p in c.points)
        talk = "; ".join(f"{o} {base:.2f}: " + " / ".join(f"{p.cross_talk[o] - base:+.2f}" for p in c.points
                                                          if o in p.cross_talk)
                         for o, base in c.cross_baseline.items()) or "-"
        table.add_row(c.user or c.label, c.persona, adoption, talk,
                      "-" if c.trained is None else str(c.trained), f"{c.wall_s:.0f}")
    console.print(table)
