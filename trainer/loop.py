"""The training loop: collect a batch, one optimizer step, gate, publish. Read top to bottom.

    Trainer(cfg, store, engine)      load the serving version's weights (crash-safe resume)
    Trainer.run(follow, steps)       loop:
        collect()                      the main process reads the store: whose adapter trains next
                                       (the owner with a full batch waiting longest), its serving
                                       version (a rollback made elsewhere?), the next batch_size useful
                                       samples, their RL baselines and the learning rate; every process
                                       gets the same Batch and loads that owner's serving weights
                                       (``holding.py``: switching owners, restoring a version)
        train_step(policy, optimizer, batch, cfg)
                                       one pure function: teacher pass, clipped surrogate, backward,
                                       clip, AdamW step; its figures in one StepMetrics record
        gate.check                     finite loss/grads/weights, canaries, KL to the previous version
        publish                        the main process writes checkpoint v<N+1> (atomic), reloads the
                                       engine and records the step (``publishing.py``); every process
                                       gets the outcome.
                                       A refused or failed step restores the last published weights.

Owners: with users (``clawproxy/users.py``) each user has an adapter of their own and there is a
shared one (owner None, the only one with no users). A step trains one owner's adapter on that
owner's samples only (``Store.training_candidates``) and publishes it under the owner's adapter
name; a user's first adapter starts from the shared one if they share, else from a fresh LoRA.

The engine keeps serving throughout: this is its own process, and the only contact is
``checkpoints.publish`` (validate, then pause-keep, reload, resume; the last good version back
after a failed reload) after a step passed the gate.

Crash safety: the ``train_steps``/``trained_samples``/``checkpoints`` rows of a step are written in
one transaction after the engine took the new weights. A crash before that leaves no trace but a
``.tmp-*`` dir or an unrecorded ``v<N>`` dir (both replaced later); on restart the trainer loads the
newest published version and the step's samples are still untrained, so nothing is trained twice
and nothing is lost.

Accelerate places the model (``Accelerator.prepare``), runs backward and gradient clipping, and
under ``accelerate launch --config_file configs/accelerate_*.yaml`` spreads each batch over the
processes. Only the main process reads and writes the store; it shares what it read or decided
twice a step, at collect and at publish (``_from_main``), and the step's figures are summed over
processes once (``StepMetrics.reduce``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from clawproxy.config import Config
from clawproxy.engine.client import Engine
from clawproxy.errors import ConfigError, EngineError
from clawproxy.store import Store
from trainer import gate
from trainer.batch import Sample, select_samples, student_prompt_ids, teacher_prompt_ids
from trainer.checkpoints import Version, checkpoints_root, current_version, ensure_engine_serves
from trainer.config import TrainerConfig
from trainer.holding import Holding
from trainer.losses import (
    PackedBatch,
    TokenBatch,
    can_pack,
    combined_advantages,
    completion_logps,
    make_packed_batch,
    make_token_batch,
    pack_groups,
    pad_floats,
    ppo_clipped_loss,
)
from trainer.metrics import StepMetrics, StepResult
from trainer.policy import (
    TEACHER_ADAPTER,
    Policy,
    Teacher,
    adapter_state,
    load_policy,
    load_tokenizer,
    unwrap,
)
from trainer.publishing import Publisher

CANARIES_KEPT = 4  # canary references kept, one per (owner, version): ~175-350 MB each for the 1.5B
log = logging.getLogger(__name__)
MIN_LR_SCALE = 1 / 8  # refusal_backoff never takes the learning rate below this share of it
T = TypeVar("T")


@dataclass
class Batch:
    """One step's input, read from the store by the main process; every process gets this copy."""

    serving: Version  # the store's current version when read (a rollback made elsewhere shows here)
    samples: list[Sample]
    baselines: dict[int, float]  # turn id -> the RL baseline subtracted from its score
    lr: float  # learning_rate after refusal_backoff
    skipped: dict[str, int]  # skip reasons recorded since the last published step
    engine_ok: bool = True  # a full batch found the engine answering /health
    owner: str | None = None  # whose adapter this batch trains (None: the shared one)
    owners: tuple[str | None, ...] = (None,)  # every owner now: a removed user's saved moments go


# -- one step ---------------------------------------------------------------------------------


def train_step(policy: Policy, optimizer: torch.optim.Optimizer, batch: Batch, cfg: TrainerConfig) -> StepMetrics:
    """One optimizer step on ``batch``; returns its figures, reduced over processes.

    Each process takes every world-th sample and accumulates the gradients of the clipped surrogate
    over micro-batches; then the gradients are clipped and AdamW steps (skipped when the loss or the
    gradient norm is not finite: the gate refuses that step anyway). Per sample, the RL term is
    ``score - baseline`` (0 for a distillation-only sample, objective ``opd``) and the OPD term
    ``clip(teacher - student)`` on the recorded tokens (0 without a hint)."""
    acc, samples = policy.accelerator, batch.samples
    t0 = time.perf_counter()
    for group in optimizer.param_groups:
        group["lr"] = batch.lr
    m = StepMetrics(
        samples=len(samples), objectives=dict(Counter(s.objective for s in samples)),
        score_mean=sum(s.score for s in samples) / len(samples),
        score_baseline=sum(batch.baselines.values()) / len(batch.baselines) if batch.baselines else 0.0,
        skipped=batch.skipped, kl_to_reference=cfg.kl_coef > 0, lr=batch.lr,
    )
    world, mbs = acc.num_processes, cfg.micro_batch_size
    mine = samples[acc.process_index :: world]
    n_micro = math.ceil(math.ceil(len(samples) / world) / mbs)
    num_tokens = sum(len(s.completion_ids) for s in samples)  # global: token-level mean over the step
    packed = packing(policy, cfg)
    chunks = (pack_groups([s.prompt_ids + s.completion_ids for s in mine], cfg.pack_tokens) if packed
              else [range(i * mbs, (i + 1) * mbs) for i in range(n_micro)])
    for rows in chunks:
        chunk, weight = [mine[j] for j in rows if j < len(mine)], 1.0
        if not chunk:  # uneven split: a zero-weight pass keeps collective ops in step
            chunk, weight = samples[:1], 0.0
        tokens = (make_packed_batch if packed else make_token_batch)(
            [s.prompt_ids for s in chunk], [s.completion_ids for s in chunk], policy.tokenizer.pad_token_id, acc.device)
        m.forwarded += weight * (tokens.input_ids.size(1) if packed
                                 else sum(len(s.prompt_ids) + len(s.completion_ids) for s in chunk))
        mask = tokens.completion_mask.float()
        behaviour = pad_floats([s.behaviour_logps for s in chunk], acc.device)
        scores = torch.tensor([s.score - batch.baselines.get(s.turn_id, 0.0) if _rl_score(s) else 0.0
                               for s in chunk], device=acc.device)

        teacher, has_teacher = teacher_logps(policy, chunk, tokens, cfg.method)
        ref = None
        if cfg.kl_coef > 0:
            with torch.no_grad(), policy.teacher.reference_model(policy.no_sync_model()) as ref_model:
                ref = completion_logps(ref_model, tokens)

        logps = completion_logps(policy.model, tokens)
        # a turn served under an instruction was sampled by the instructed model: its ratio to the
        # student is no importance weight, and it would silence the very tokens the instruction changed
        instructed = torch.tensor([s.served_instruction is not None for s in chunk], device=acc.device)
        behaviour = torch.where(instructed.unsqueeze(1), logps.detach(), behaviour)
        adv = combined_advantages(
            scores, teacher, logps.detach(), has_teacher, mask,
            w_rl=cfg.w_rl if cfg.method != "opd" else 0.0,
            w_opd=cfg.w_opd if cfg.method != "rl" else 0.0,
            clip=cfg.opd_clip,
        )
        loss, stats = ppo_clipped_loss(
            logps, behaviour, adv, mask, epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high,
            num_tokens=num_tokens, ref_logps=ref, kl_coef=cfg.kl_coef,
        )
        acc.backward(loss * weight * world)  # DDP/FSDP average gradients over processes
        m.count(chunk, weight, loss, stats, adv, mask, teacher - logps.detach(), has_teacher)

    m.reduce(acc)
    m.grad_norm = float(acc.clip_grad_norm_(policy.params, cfg.max_grad_norm))
    if math.isfinite(m.loss) and math.isfinite(m.grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    m.train_s = time.perf_counter() - t0
    return m


def teacher_logps(policy: Policy, chunk: list[Sample], tokens: TokenBatch | PackedBatch, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher log-probs of the recorded completion tokens given the hinted prompt (no grad), and
    which samples have one: zeros and False for samples without a hint, and for method=rl."""
    dev = policy.accelerator.device
    t_logps = torch.zeros(tokens.completion_ids.shape, device=dev)
    has = torch.zeros(len(chunk), dtype=torch.bool, device=dev)
    if method == "rl":
        return t_logps, has
    hinted_prompts = {i: p for i, s in enumerate(chunk) if (p := teacher_prompt_ids(policy.tokenizer, s)) is not None}
    if not hinted_prompts:
        if policy.accelerator.num_processes > 1:
            # FSDP all-gathers in every forward: every process must run the same passes, so a
            # micro-batch without hints still runs (and discards) one teacher pass
            with torch.no_grad(), policy.teacher.teacher_model(policy.no_sync_model()) as teacher:
                completion_logps(teacher, tokens)
        return t_logps, has
    make = make_packed_batch if isinstance(tokens, PackedBatch) else make_token_batch
    # a step distils an owner's preferences on every sample or on none, so this is one pass in practice
    for distilled in sorted({chunk[i].distilled for i in hinted_prompts}):
        rows = [i for i in hinted_prompts if chunk[i].distilled == distilled]
        hinted = make([hinted_prompts[i] for i in rows], [chunk[i].completion_ids for i in rows],
                      policy.tokenizer.pad_token_id, dev)
        with torch.no_grad(), policy.teacher.teacher_model(policy.no_sync_model(), distilled=distilled) as teacher:
            lp = completion_logps(teacher, hinted)
        for row, i in enumerate(rows):
            n = len(chunk[i].completion_ids)
            t_logps[i, :n] = lp[row, :n]
            has[i] = True
    return t_logps, has


def packing(policy: Policy, cfg: TrainerConfig) -> bool:
    """Tree packing is on: asked for, one process (each would pack a different number of passes,
    and FSDP needs the same), and an attention that takes a tree mask."""
    return cfg.pack_prefixes and policy.accelerator.num_processes == 1 and can_pack(policy.model)


def _rl_score(s: Sample) -> int:
    """The score the RL term uses: 0 for a distillation-only sample."""
    return 0 if s.objective == "opd" else s.score


# -- what the main process reads for a step ----------------------------------------------------


def score_baselines(store: Store, cfg: TrainerConfig, samples: list[Sample],
                    owner: str | None = None) -> dict[int, float]:
    """Each sample's RL baseline, leave-one-out (RLOO): the mean non-zero judge score of the
    other RL samples in this batch and the last ``baseline_window`` trained before it (a
    distillation-only sample has no score to share, whatever the judge said). Leaving
    the sample itself out keeps the estimate unbiased; an all-fail (or all-pass) batch with no
    history then moves nothing by RL, as a zero-variance group does in GRPO. All 0 with a
    window of 0. History comes from the store, so a restart keeps it, and from ``owner``'s
    adapter alone, so no one else's scores steer it."""
    window = cfg.baseline_window
    if window <= 0:
        return {s.turn_id: 0.0 for s in samples}
    pool = store.recent_trained_scores(window, owner) + [s.score for s in samples if _rl_score(s)]
    total, n = sum(pool), len(pool)
    out = {}
    for s in samples:
        others = n - 1 if _rl_score(s) else n
        rest = total - s.score if _rl_score(s) else total
        out[s.turn_id] = rest / others if others else 0.0
    return out


def learning_rate(store: Store, cfg: TrainerConfig, version: int, owner: str | None = None) -> float:
    """``learning_rate``, backed off by ``refusal_backoff`` per gate refusal in a row of ``owner``'s
    adapter from ``version`` (read from the store, so a restart keeps it), never below 1/8 of it."""
    lr, factor = cfg.learning_rate, cfg.refusal_backoff
    if factor >= 1:
        return lr
    refused = 0
    for r in store.recent_steps(16, owner):
        if r["status"] != "gate_failed" or r["base_version"] != version:
            break
        refused += 1
    return lr * max(factor**refused, MIN_LR_SCALE)


def teacher_problem(tokenizer: Any, cfg: TrainerConfig, s: Sample) -> str | None:
    """``teacher_too_long`` when the OPD teacher's prompt (the recorded one plus the hint) and the
    completion exceed ``max_seq_len`` (the teacher pass would cost more than the trainer allows);
    ``no_teacher`` when a distillation-only sample has no teacher prompt (it would train nothing)."""
    if cfg.method == "rl" or not s.hint:
        return None
    ids = teacher_prompt_ids(tokenizer, s)
    if ids is None:
        return "no_teacher" if s.objective == "opd" else None
    return "teacher_too_long" if len(ids) + len(s.completion_ids) > cfg.max_seq_len else None


def _from_main(accelerator: Any, read: Callable[[], T]) -> T:
    """``read()`` run by the main process and shared, so every process takes the same branch
    (a process that decides differently would hang the others in the next collective)."""
    if accelerator.num_processes == 1:
        return read()
    from accelerate.utils import broadcast_object_list

    box: list[Any] = [None]
    if accelerator.is_main_process:
        try:
            box = [(True, read())]
        except Exception as e:  # every process raises it: one left waiting would hang the others
            box = [(False, e)]
    broadcast_object_list(box)
    ok, value = box[0]
    if not ok:
        raise value
    return value


# -- the loop ---------------------------------------------------------------------------------


class Trainer:
    """One policy, one optimizer, one loop. ``engine`` None: publish to disk and the store only."""

    def __init__(self, cfg: Config, store: Store, engine: Engine | None = None, accelerator: Any | None = None):
        from accelerate import Accelerator

        from clawproxy.engine.model import resolve_model

        self.cfg = cfg
        self.tcfg = cfg.trainer
        if self.tcfg.threads:
            torch.set_num_threads(self.tcfg.threads)
        self.store = store
        self.engine = engine
        accelerator = accelerator or Accelerator()
        self.base_dir = local_model_dir(resolve_model(cfg.engine.model, cfg.data_path))
        self.ckpt_root = checkpoints_root(cfg.data_path)
        self.is_lora = self.tcfg.finetune == "lora"
        self._check_users()
        tokenizer = load_tokenizer(self.base_dir)
        current = current_version(store, self.base_dir)
        model, fresh = load_policy(self.tcfg, self.base_dir, current)
        model = model.to(accelerator.device)
        teacher = Teacher(self.tcfg, model, self.base_dir, accelerator.device)
        params = [p for n, p in model.named_parameters() if p.requires_grad and f".{TEACHER_ADAPTER}." not in n]
        optimizer = torch.optim.AdamW(params, lr=self.tcfg.learning_rate, weight_decay=self.tcfg.weight_decay)
        model, self.optimizer = accelerator.prepare(model, optimizer)
        self.policy = Policy(model, params, teacher, tokenizer, accelerator)
        self.held = Holding(self.policy, self.optimizer, self.base_dir, fresh, current)
        self.publisher = Publisher(cfg, store, engine, self.policy, self.base_dir, self.ckpt_root)
        # each (owner, version)'s canary answers, newest last: a refused step or a switch back to a
        # user whose adapter has not changed reuses them instead of generating them again
        self.canaries: OrderedDict[tuple[str | None, int], gate.CanaryReference] = OrderedDict()
        self.skipped: Counter[str] = Counter()  # main process: skip reasons since the last published step
        log.info("trainer ready: %s from v%d (%s), teacher=%s, method=%s",
                 self.tcfg.finetune, self.current.version, self.current.path, self.tcfg.teacher, self.tcfg.method)

    @property
    def owner(self) -> str | None:
        """Whose adapter the policy holds (None: the shared one)."""
        return self.held.owner

    @property
    def current(self) -> Version:
        """The version the policy's weights are."""
        return self.held.current

    def run(
        self, follow: bool = False, steps: int | None = None,
        on_step: Callable[[StepResult], None] | None = None,
        on_wait: Callable[[int], None] | None = None,
    ) -> list[StepResult]:
        """Train while full batches are available (``follow``: wait for more, forever or ``steps``)."""
        results: list[StepResult] = []
        while steps is None or len(results) < steps:
            batch = self.collect()
            self._canary()  # off the critical path: computed while waiting for samples
            if len(batch.samples) < self.tcfg.batch_size:
                if not follow:
                    break
                if on_wait:
                    on_wait(len(batch.samples))
                time.sleep(self.tcfg.poll_interval_s)
                continue
            if not batch.engine_ok and self.engine is not None:  # publishing would fail: wait for it
                if not follow:
                    raise EngineError(f"engine at {self.engine.base_url} is not answering /health")
                log.warning("engine not healthy; waiting before training")
                time.sleep(self.tcfg.poll_interval_s)
                continue
            result = self.step(batch)
            results.append(result)
            if on_step:
                on_step(result)
            if follow and result.status == "error":  # the same samples wait for the disk or the engine
                time.sleep(self.tcfg.poll_interval_s)
        return results

    def collect(self) -> Batch:
        """The main process reads the next batch, every process gets it (the first of a step's two
        broadcasts), and the policy follows the serving version: `clawproxy rollback` may have
        changed it while we ran. A restarted engine is given that version back."""

        def read() -> Batch:
            owners = self.store.owners()
            self._check_users(len(owners) > 1)
            if self.engine is not None:
                try:
                    ensure_engine_serves(self.store, self.engine, self.base_dir)
                except EngineError as e:
                    log.warning("engine did not take the serving adapters back: %s", e.message)
            ready = {owner: self._ready(owner) for owner in owners}
            full = [o for o in owners if len(ready[o]) == self.tcfg.batch_size]
            # the owner whose oldest ready sample waits longest; none full: the policy's own (waiting)
            owner = min(full, key=lambda o: ready[o][0].turn_id) if full else self.owner
            samples = ready.get(owner, [])
            serving = current_version(self.store, self.base_dir, owner)
            return Batch(
                serving, samples, score_baselines(self.store, self.tcfg, samples, owner),
                learning_rate(self.store, self.tcfg, serving.version, owner), dict(self.skipped),
                engine_ok=self.engine is None or not full or self.engine.health(), owner=owner,
                owners=tuple(owners),
            )

        batch = _from_main(self.policy.accelerator, read)
        self.held.keep_moments_of(batch.owners)
        if batch.owner != self.owner:
            log.info("training %s from v%d", _whose(batch.owner), batch.serving.version)
            self.held.switch(batch.owner, batch.serving)
        elif batch.serving.version != self.current.version:
            if self.current.version >= 0:  # -1: a removed user's weights were just dropped, nothing changed elsewhere
                log.info("serving version changed to v%d outside this trainer; reloading it", batch.serving.version)
            self._restore(batch.serving)
        return batch

    def _ready(self, owner: str | None) -> list[Sample]:
        """Main process: up to batch_size useful samples for ``owner``'s adapter, oldest first; the
        rejects are recorded with their reasons."""
        # staleness is counted on the owner's chain (Store.stale_below), from its serving version with no users
        ref = self.store.stale_below(owner, self.tcfg.max_staleness) + self.tcfg.max_staleness
        distill = self._distilled(owner)
        sel = select_samples(self.store, self.tcfg, ref, owner=owner, tools_as_text=self.cfg.engine.spec.tools_as_text,
                             distill=" ".join(p["text"] for p in distill) or None)
        samples: list[Sample] = []
        for s in sel.samples:
            if len(samples) == self.tcfg.batch_size:
                break
            student = student_prompt_ids(self.policy.tokenizer, s)
            if student is None:
                sel.skipped[s.turn_id] = "no_student_prompt"
                continue
            s.prompt_ids = student
            problem = teacher_problem(self.policy.tokenizer, self.tcfg, s)
            if problem:
                sel.skipped[s.turn_id] = problem
            else:
                samples.append(s)
        if sel.skipped:
            self.store.record_skipped(sel.skipped)
            self.skipped.update(sel.skipped.values())
        return samples

    def _distilled(self, owner: str | None) -> list[dict[str, Any]]:
        """The owner's active preferences that go into their weights (``trying.apply``: weights or both)."""
        if self.cfg.trying.apply == "prompt":
            return []
        return self.store.active_preferences(owner)

    def _absorbed(self, owner: str | None, m: StepMetrics) -> None:
        """After a published step: the student's mean gap to the instructed teacher on this batch; a
        preference whose gap stayed under ``trying.absorb_gap`` two steps running is served without
        its prompt (``trying.apply: both``), since the adapter now follows it alone."""
        if m.opd_tokens <= 0:
            return
        gap = abs(m.opd_gap_sum / m.opd_tokens)
        limit = self.cfg.trying.absorb_gap
        for p in self._distilled(owner):
            absorbed = gap < limit and p["gap"] is not None and abs(float(p["gap"])) < limit
            self.store.set_preference_gap(int(p["id"]), gap, absorbed and self.cfg.trying.apply == "both")
            if absorbed and not p["absorbed"]:
                log.info("%s: the adapter follows %r without the prompt (gap %.4f nats a token)",
                         _whose(owner), p["text"], gap)

    def _check_users(self, has_users: bool | None = None) -> None:
        """Users each get an adapter of their own: full fine-tuning (one set of weights) and an
        engine that merges its one adapter into the base (the embedded one) cannot keep them apart."""
        if not (self.store.has_users() if has_users is None else has_users):
            return
        if not self.is_lora:
            raise ConfigError("this proxy has users, and each user trains an adapter of their own: set "
                              "trainer.finetune: lora (full fine-tuning has one set of weights for everyone).")
        if self.engine is not None and not self.engine.spec.adapters_by_name:
            raise ConfigError("this proxy has users, whose adapters the vLLM and llama.cpp engines serve side "
                              "by side; the embedded engine serves one adapter for everyone: use engine.kind "
                              "vllm or llamacpp.")

    def step(self, batch: Batch) -> StepResult:
        """Train on ``batch``, gate the new weights, then publish them or go back to the last published."""
        batch_ready = time.time()
        acc = self.policy.accelerator
        t0 = time.perf_counter()
        previous = self._canary()
        canary_s = time.perf_counter() - t0
        m = train_step(self.policy, self.optimizer, batch, self.tcfg)
        t0 = time.perf_counter()
        report, new_ref = gate.check(self.policy.no_sync_model(), self.policy.tokenizer, self.tcfg, previous,
                                     loss=m.loss, grad_norm=m.grad_norm, accelerator=acc)
        m.gate = report.as_dict()
        m.gate_s, m.canary_s = time.perf_counter() - t0, canary_s
        base = self.current.version
        if not report.ok:
            # refused samples count as used: a batch that poisons the weights would be retried forever
            log.warning("publish gate refused step from v%d: %s", base, ", ".join(report.failed))
            step_id = None
            if acc.is_main_process:
                step_id = self.publisher.record(self.held, batch.samples, m, "gate_failed", None)
                self.store.log_event("gate_failed", {"step_id": step_id, "base_version": base,
                                                     "failed": report.failed, "gate": report.as_dict()})
            if not previous.finite:  # made from weights that were already broken: not the version's own
                self.canaries.pop((self.owner, previous.version), None)
            self._restore(self.current)
            return StepResult(step_id, "gate_failed", base, None, m.as_dict())

        t0 = time.perf_counter()
        # collective under FSDP (gathers the full weights), so every process calls it
        state_dict = acc.get_state_dict(self.policy.model) if not self.is_lora else None
        owner = self.owner
        status, version, step_id, m = _from_main(acc, lambda: self.publisher.publish(
            self.held, batch.samples, m, state_dict, t0, batch_ready, lambda m: self._absorbed(owner, m)))
        if status == "superseded":  # collect() loads the version now serving before the next step
            return StepResult(step_id, status, base, None, m.as_dict())
        if status == "user_removed":
            self.canaries = OrderedDict((k, v) for k, v in self.canaries.items() if k[0] != owner)
            self.held.forget_owner()
            return StepResult(None, status, base, None, m.as_dict())
        if status != "published" or version is None:
            self._restore(self.current)
            return StepResult(step_id, status, base, None, m.as_dict())
        self.held.current = Version(version, self.ckpt_root / f"v{version}", "lora" if self.is_lora else "full")
        self.policy.teacher.after_step(self.policy.model)
        new_ref.version = version
        self._keep_canary(owner, new_ref)
        self.skipped.clear()
        return StepResult(step_id, "published", base, version, m.as_dict())

    def _canary(self) -> gate.CanaryReference:
        """The serving version's canary answers, the gate's point of comparison (generated once per
        owner and version)."""
        ref = self.canaries.get((self.owner, self.current.version))
        if ref is None:
            ref = gate.canary_reference(self.policy.no_sync_model(), self.policy.tokenizer, self.tcfg,
                                        self.current.version, self.policy.accelerator)
        self._keep_canary(self.owner, ref)
        return ref

    def _keep_canary(self, owner: str | None, ref: gate.CanaryReference) -> None:
        self.canaries[(owner, ref.version)] = ref
        self.canaries.move_to_end((owner, ref.version))
        while len(self.canaries) > CANARIES_KEPT:
            self.canaries.popitem(last=False)

    def _restore(self, version: Version) -> None:
        """Put ``version``'s weights back (its canary answers, if kept, are still its own)."""
        self.held.restore(version)

    def adapter_weights(self) -> dict[str, torch.Tensor]:
        """The policy's adapter weights now (PEFT's state dict, on the CPU)."""
        return adapter_state(unwrap(self.policy.model))


def _whose(owner: str | None) -> str:
    return "the shared adapter" if owner is None else f"user {owner}'s adapter"


def local_model_dir(spec: Path | str) -> Path:
    """A local directory for the base model (version 0): the trainer reloads it from disk after a
    refused step, and hands its path to the engine on `rollback 0`. A Hugging Face id (the GPU
    configs name Qwen/Qwen3-4B) resolves to its snapshot in the HF cache, downloaded if needed
    and allowed by the user's HF settings."""
    path = Path(spec)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(spec), allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]))
