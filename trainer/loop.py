"""The training loop: collect a batch, one optimizer step, gate, publish. Read top to bottom.

    Trainer(cfg, store, engine)      load the serving version's weights (crash-safe resume)
    Trainer.run(follow, steps)       loop:
        collect()                      the main process reads the store: whose adapter trains next
                                       (the owner with a full batch waiting longest), its serving
                                       version (a rollback made elsewhere?), the next batch_size useful
                                       samples, their RL baselines and the learning rate; every process
                                       gets the same Batch and loads that owner's serving weights
        train_step(policy, optimizer, batch, cfg)
                                       one pure function: teacher pass, clipped surrogate, backward,
                                       clip, AdamW step; its figures in one StepMetrics record
        gate.check                     finite loss/grads/weights, canaries, KL to the previous version
        publish                        the main process writes checkpoint v<N+1> (atomic), reloads the
                                       engine and records the step; every process gets the outcome.
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
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import torch

from clawproxy.config import Config
from clawproxy.engine.model import torch_dtype
from clawproxy.errors import ConfigError, EngineError
from clawproxy.store import Store
from trainer import gate
from trainer.batch import Sample, select_samples, student_prompt_ids, teacher_prompt_ids
from trainer.checkpoints import (
    Version,
    checkpoints_root,
    current_version,
    ensure_engine_serves,
    is_refusal,
    next_version,
    prune,
    publish,
    validate_checkpoint,
    write_atomically,
)
from trainer.config import TrainerConfig
from trainer.losses import (
    PackedBatch,
    TokenBatch,
    TokenTrie,
    can_pack,
    combined_advantages,
    completion_logps,
    make_packed_batch,
    make_token_batch,
    pad_floats,
    ppo_clipped_loss,
)
from trainer.policy import (
    TEACHER_ADAPTER,
    Teacher,
    adapter_state,
    load_policy,
    load_tokenizer,
    load_version_into,
    unwrap,
)

log = logging.getLogger(__name__)
MIN_LR_SCALE = 1 / 8  # refusal_backoff never takes the learning rate below this share of it
T = TypeVar("T")


@dataclass
class Policy:
    """What a step trains: the accelerate-prepared model and its trainable parameters, the OPD
    teacher (and KL reference), the tokenizer, and the accelerator that places them."""

    model: torch.nn.Module
    params: list[torch.nn.Parameter]
    teacher: Teacher
    tokenizer: Any
    accelerator: Any

    def no_sync_model(self) -> torch.nn.Module:
        """The model for gradient-free passes: under DDP the inner module, whose forward does no
        collective (DDP's would broadcast buffers); FSDP needs its wrapper to gather shards."""
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type == DistributedType.FSDP:
            return self.model
        return unwrap(self.model)


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


def _summed() -> Any:
    return field(default=0.0, metadata={"summed": True})


@dataclass
class StepMetrics:
    """Every figure of one step, in one record; ``as_dict`` is what ``train_steps.metrics`` stores.

    The sums add up over micro-batches and are summed over processes once, at the end of
    ``train_step``; means per completion token are taken from them when the record is read."""

    # summed over micro-batches (weighted: a zero-weight filler pass counts nothing), then processes
    loss: float = _summed()
    tokens: float = _summed()
    completion_tokens: float = _summed()
    adv_sum: float = _summed()
    clip_sum: float = _summed()
    kl_behaviour_sum: float = _summed()
    kl_ref_sum: float = _summed()
    ratio_sum: float = _summed()
    opd_samples: float = _summed()
    opd_gap_sum: float = _summed()
    opd_tokens: float = _summed()
    forwarded: float = _summed()  # tokens the policy pass computed: fewer than ``tokens`` when packed
    passes: float = _summed()  # forward/backward passes of the policy
    # the batch and the update
    samples: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    score_mean: float = 0.0
    score_baseline: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)
    kl_to_reference: bool = False  # kl_coef > 0: "kl" is the KL to the base model, else to the behaviour
    lr: float = 0.0
    grad_norm: float = 0.0
    train_s: float = 0.0
    # the gate and the publish
    gate: dict[str, Any] | None = None
    save_s: float | None = None
    reload_s: float | None = None
    publish_s: float | None = None
    batch_to_serving_s: float | None = None
    save_error: str | None = None
    engine_error: str | None = None

    def count(self, chunk: list[Sample], weight: float, loss: torch.Tensor, stats: Any, adv: torch.Tensor,
              mask: torch.Tensor, gap: torch.Tensor, has_teacher: torch.Tensor) -> None:
        """Add one micro-batch: its loss, tokens and per-token statistics, times ``weight``."""
        n = float(mask.sum()) * weight
        hinted = mask * has_teacher.float().unsqueeze(1)
        self.loss += float(loss.detach()) * weight
        self.tokens += sum(len(s.prompt_ids) + len(s.completion_ids) for s in chunk) * weight
        self.completion_tokens += n
        self.adv_sum += float((adv * mask).sum()) * weight
        self.clip_sum += stats.clip_frac * n
        self.kl_behaviour_sum += stats.kl_behaviour * n
        self.kl_ref_sum += stats.kl_ref * n
        self.ratio_sum += stats.ratio_mean * n
        self.opd_samples += float(has_teacher.sum()) * weight
        self.opd_gap_sum += float((gap * hinted).sum()) * weight
        self.opd_tokens += float(hinted.sum()) * weight
        self.passes += weight

    def reduce(self, accelerator: Any) -> None:
        """Sum the micro-batch sums over processes: the step's one collective for its figures."""
        if accelerator.num_processes == 1:
            return
        names = [f.name for f in fields(self) if f.metadata.get("summed")]
        vec = torch.tensor([getattr(self, k) for k in names], device=accelerator.device, dtype=torch.float64)
        for k, v in zip(names, accelerator.reduce(vec, "sum").tolist(), strict=True):
            setattr(self, k, v)

    def as_dict(self) -> dict[str, Any]:
        ct = max(self.completion_tokens, 1.0)
        out: dict[str, Any] = {
            "loss": self.loss,
            "adv_mean": self.adv_sum / ct,
            "clip_frac": self.clip_sum / ct,
            "kl": (self.kl_ref_sum if self.kl_to_reference else self.kl_behaviour_sum) / ct,
            "kl_behaviour": self.kl_behaviour_sum / ct,
            "ratio_mean": self.ratio_sum / ct,
            "tokens": int(self.tokens),
            "completion_tokens": int(self.completion_tokens),
            "forwarded_tokens": int(self.forwarded),
            "passes": int(self.passes),
            "opd_samples": int(self.opd_samples),
            "opd_gap_mean": self.opd_gap_sum / max(self.opd_tokens, 1.0),
            "score_mean": self.score_mean,
            "kinds": self.kinds,
            "score_baseline": self.score_baseline,
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "train_s": self.train_s,
            "tokens_per_s": int(self.tokens) / max(self.train_s, 1e-9),
            "skipped": self.skipped,
            "samples": self.samples,
        }
        for key in ("gate", "save_s", "reload_s", "publish_s", "batch_to_serving_s", "save_error", "engine_error"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass
class StepResult:
    step_id: int | None
    status: str  # published | gate_failed | error | superseded (a rollback came first) | user_removed
    base_version: int
    new_version: int | None
    metrics: dict[str, Any] = field(default_factory=dict)  # StepMetrics.as_dict()


# -- one step ---------------------------------------------------------------------------------


def train_step(policy: Policy, optimizer: torch.optim.Optimizer, batch: Batch, cfg: TrainerConfig) -> StepMetrics:
    """One optimizer step on ``batch``; returns its figures, reduced over processes.

    Each process takes every world-th sample and accumulates the gradients of the clipped surrogate
    over micro-batches; then the gradients are clipped and AdamW steps (skipped when the loss or the
    gradient norm is not finite: the gate refuses that step anyway). Per sample, the RL term is
    ``score - baseline`` (0 for a distillation-only sample, kind ``opd``) and the OPD term
    ``clip(teacher - student)`` on the recorded tokens (0 without a hint)."""
    acc, samples = policy.accelerator, batch.samples
    t0 = time.perf_counter()
    for group in optimizer.param_groups:
        group["lr"] = batch.lr
    m = StepMetrics(
        samples=len(samples), kinds=dict(Counter(s.kind for s in samples)),
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
    hinted = make(list(hinted_prompts.values()), [chunk[i].completion_ids for i in hinted_prompts],
                  policy.tokenizer.pad_token_id, dev)
    with torch.no_grad(), policy.teacher.teacher_model(policy.no_sync_model()) as teacher:
        lp = completion_logps(teacher, hinted)
    for row, i in enumerate(hinted_prompts):
        n = len(chunk[i].completion_ids)
        t_logps[i, :n] = lp[row, :n]
        has[i] = True
    return t_logps, has


def packing(policy: Policy, cfg: TrainerConfig) -> bool:
    """Tree packing is on: asked for, one process (each would pack a different number of passes,
    and FSDP needs the same), and an attention that takes a tree mask."""
    return cfg.pack_prefixes and policy.accelerator.num_processes == 1 and can_pack(policy.model)


def pack_groups(sequences: list[list[int]], budget: int) -> list[list[int]]:
    """Indices of ``sequences`` in passes, in order: a sequence joins the current pass while the
    pass's trie stays within ``budget`` tokens (one longer than the budget gets a pass alone)."""
    groups: list[list[int]] = []
    trie = TokenTrie()
    for i, seq in enumerate(sequences):
        if not groups or trie.size + trie.new_tokens(seq) > budget:
            groups.append([])
            trie = TokenTrie()
        groups[-1].append(i)
        trie.add(seq)
    return groups


def _rl_score(s: Sample) -> int:
    """The score the RL term uses: 0 for a distillation-only sample."""
    return 0 if s.kind == "opd" else s.score


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
        return "no_teacher" if s.kind == "opd" else None
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

    def __init__(self, cfg: Config, store: Store, engine: Any | None = None, accelerator: Any | None = None):
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
        self.owner: str | None = None  # whose adapter the policy holds (None: the shared one)
        self.current: Version = current_version(store, self.base_dir)
        model, self.fresh = load_policy(self.tcfg, self.base_dir, self.current)
        model = model.to(accelerator.device)
        teacher = Teacher(self.tcfg, model, self.base_dir, accelerator.device)
        params = [p for n, p in model.named_parameters() if p.requires_grad and f".{TEACHER_ADAPTER}." not in n]
        optimizer = torch.optim.AdamW(params, lr=self.tcfg.learning_rate, weight_decay=self.tcfg.weight_decay)
        model, self.optimizer = accelerator.prepare(model, optimizer)
        self.policy = Policy(model, params, teacher, tokenizer, accelerator)
        self.canary: gate.CanaryReference | None = None
        self.skipped: Counter[str] = Counter()  # main process: skip reasons since the last published step
        # Adam's moments of the owners the policy left, with the version they were built on: a
        # step alternating owners keeps each one's moments (a fresh Adam would take sign-sized
        # first steps every time), and they are only ever put back on that owner's same weights
        self.moments: dict[str | None, tuple[int, dict[str, Any]]] = {}
        log.info("trainer ready: %s from v%d (%s), teacher=%s, method=%s",
                 self.tcfg.finetune, self.current.version, self.current.path, self.tcfg.teacher, self.tcfg.method)

    def run(
        self, follow: bool = False, steps: int | None = None,
        on_step: Callable[[StepResult], None] | None = None,
        on_wait: Callable[[int], None] | None = None,
    ) -> list[StepResult]:
        """Train while full batches are available (``follow``: wait for more, forever or ``steps``)."""
        results: list[StepResult] = []
        while steps is None or len(results) < steps:
            batch = self.collect()
            self._ensure_canary()  # off the critical path: computed while waiting for samples
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
        for gone in set(self.moments) - set(batch.owners):
            del self.moments[gone]
        if batch.owner != self.owner:
            log.info("training %s from v%d", _whose(batch.owner), batch.serving.version)
            self._switch(batch.owner, batch.serving)
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
            raise ConfigError("this proxy has users, whose adapters a vLLM engine serves side by side; the "
                              "embedded engine serves one adapter for everyone: use engine.kind vllm.")

    def step(self, batch: Batch) -> StepResult:
        """Train on ``batch``, gate the new weights, then publish them or go back to the last published."""
        batch_ready = time.time()
        acc = self.policy.accelerator
        self._ensure_canary()
        m = train_step(self.policy, self.optimizer, batch, self.tcfg)
        report, new_ref = gate.check(self.policy.no_sync_model(), self.policy.tokenizer, self.tcfg, self.canary,
                                     loss=m.loss, grad_norm=m.grad_norm, accelerator=acc)
        m.gate = report.as_dict()
        base = self.current.version
        if not report.ok:
            # refused samples count as used: a batch that poisons the weights would be retried forever
            log.warning("publish gate refused step from v%d: %s", base, ", ".join(report.failed))
            step_id = None
            if acc.is_main_process:
                step_id = self._record(batch.samples, m, "gate_failed", None)
                self.store.log_event("gate_failed", {"step_id": step_id, "base_version": base,
                                                     "failed": report.failed, "gate": report.as_dict()})
            self._restore(self.current)
            return StepResult(step_id, "gate_failed", base, None, m.as_dict())

        t0 = time.perf_counter()
        # collective under FSDP (gathers the full weights), so every process calls it
        state_dict = acc.get_state_dict(self.policy.model) if not self.is_lora else None
        status, version, step_id, m = _from_main(
            acc, lambda: self._publish(batch.samples, m, state_dict, t0, batch_ready))
        if status == "superseded":  # collect() loads the version now serving before the next step
            return StepResult(step_id, status, base, None, m.as_dict())
        if status == "user_removed":
            self._forget_owner()
            return StepResult(None, status, base, None, m.as_dict())
        if status != "published" or version is None:
            self._restore(self.current)
            return StepResult(step_id, status, base, None, m.as_dict())
        self.current = Version(version, self.ckpt_root / f"v{version}", "lora" if self.is_lora else "full")
        self.policy.teacher.after_step(self.policy.model)
        new_ref.version = version
        self.canary = new_ref
        self.skipped.clear()
        return StepResult(step_id, "published", base, version, m.as_dict())

    def _ensure_canary(self) -> None:
        """The serving version's canary answers, the gate's point of comparison."""
        if self.canary is None or self.canary.version != self.current.version:
            self.canary = gate.canary_reference(self.policy.no_sync_model(), self.policy.tokenizer, self.tcfg,
                                                self.current.version, self.policy.accelerator)

    def _publish(
        self, samples: list[Sample], m: StepMetrics, state_dict: dict[str, Any] | None, t0: float,
        batch_ready: float,
    ) -> tuple[str, int | None, int | None, StepMetrics]:
        """Main process: checkpoint v<N> -> engine reload -> rows. Returns (status, version, step_id,
        the metrics with the publish's figures); the second of a step's two broadcasts shares it.

        Under the publish lock: a rollback made while this step trained wins ("superseded"; the
        samples stay untrained and are trained again from the version it put back)."""
        with self.store.publish_lock():
            if self.owner is not None and self.store.get_user(self.owner) is None:
                log.warning("user %s was removed while this step trained; dropping it", self.owner)
                return "user_removed", None, None, m  # nothing of theirs may be written or served
            latest = current_version(self.store, self.base_dir, self.owner).version
            if latest != self.current.version:
                log.warning("v%d was published while this step trained from v%d; dropping the step",
                            latest, self.current.version)
                return "superseded", None, self._record([], m, "superseded", None), m
            version = next_version(self.store)
            out_dir = self.ckpt_root / f"v{version}"
            try:
                write_atomically(out_dir, lambda tmp: self._save(tmp, state_dict))
            except OSError as e:  # disk full, read-only, permissions: the samples are not the problem
                why = e.strerror or str(e)
                log.error("could not write checkpoint v%d in %s (%s); keeping v%d. Free disk space there "
                          "(trainer.keep_checkpoints keeps fewer); the samples stay untrained and are "
                          "trained again.", version, self.ckpt_root, why, self.current.version)
                m.save_error = why
                step_id = self._record([], m, "error", None)
                self.store.log_event("checkpoint_write_failed", {"version": version, "error": why, "step_id": step_id})
                return "error", None, step_id, m
            m.save_s = time.perf_counter() - t0
            new = Version(version, out_dir, "lora" if self.is_lora else "full")
            try:
                if self.engine is not None:
                    t_reload = time.perf_counter()
                    publish(self.engine, new, self.current, self.base_dir, self.owner)
                    m.reload_s = time.perf_counter() - t_reload  # /metrics: engine reload durations
                else:
                    validate_checkpoint(out_dir, new.kind, self.base_dir)
            except EngineError as e:
                log.error("engine did not take v%d: %s; keeping v%d", version, e.message, self.current.version)
                m.engine_error = e.message
                # refused (the checkpoint is the problem): the samples are used up; unreachable or
                # busy (502/503/504): the samples stay untrained and are retried
                step_id = self._record(samples if is_refusal(e) else [], m, "error", None)
                self.store.log_event("reload_refused", {"version": version, "error": e.message, "step_id": step_id})
                shutil.rmtree(out_dir, ignore_errors=True)
                return "error", None, step_id, m
            m.publish_s = time.perf_counter() - t0
            m.batch_to_serving_s = time.time() - batch_ready
            step_id = self._record(samples, m, "published", version, out_dir)
            self._absorbed(self.owner, m)
            deleted = prune(self.store, self.tcfg.keep_checkpoints, self.ckpt_root)
            if deleted:
                log.info("deleted old checkpoints %s", deleted)
            return "published", version, step_id, m

    def _save(self, tmp: Path, state_dict: dict[str, Any] | None) -> None:
        model = unwrap(self.policy.model)
        if self.is_lora:
            model.save_pretrained(str(tmp), selected_adapters=["default"])
            nested = tmp / "default"  # PEFT nests non-default selections; keep the dir flat
            if nested.is_dir():
                for f in nested.iterdir():
                    f.rename(tmp / f.name)
                nested.rmdir()
        else:
            # written in the engine's dtype: fp32 master weights would double the checkpoint size
            if self.cfg.engine.dtype != "float32":
                dtype = torch_dtype(self.cfg.engine.dtype)
                state_dict = {k: v.to(dtype) for k, v in (state_dict or model.state_dict()).items()}
            model.save_pretrained(str(tmp), state_dict=state_dict, safe_serialization=True)
        self.policy.tokenizer.save_pretrained(str(tmp))

    def _record(self, samples: list[Sample], m: StepMetrics, status: str, version: int | None,
                out_dir: Path | None = None) -> int:
        """One transaction: the step, the samples it consumed, and (published) the checkpoint row."""
        published = status == "published" and version is not None
        return self.store.record_step(
            method=self.tcfg.method, base_version=self.current.version, new_version=version, status=status,
            metrics=_jsonable(m.as_dict()), kinds={s.turn_id: s.kind for s in samples},
            checkpoint={"path": str(out_dir), "kind": "lora" if self.is_lora else "full",
                        "gate": _jsonable(m.gate), "engine": self.engine is not None} if published else None,
            owner=self.owner,
        )

    def _restore(self, version: Version) -> None:
        """Put ``version``'s weights back into the policy and forget the optimizer's moments."""
        from accelerate.utils import DistributedType

        sharded = self.policy.accelerator.distributed_type == DistributedType.FSDP
        load_version_into(unwrap(self.policy.model), version, self.base_dir, sharded=sharded, fresh=self.fresh)
        self.optimizer.zero_grad(set_to_none=True)
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        inner.state.clear()
        self.current = version
        self.canary = None  # recomputed from the restored weights before the next step

    def _forget_owner(self) -> None:
        """Drop a removed user's weights and Adam moments; collect() loads the next owner's adapter."""
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        inner.state.clear()
        self.moments.pop(self.owner, None)
        self.owner = None
        self.current = Version(-1, self.base_dir, self.current.kind)  # serves nobody: collect() restores
        self.canary = None

    def _switch(self, owner: str | None, version: Version) -> None:
        """Turn the policy to ``owner``'s adapter at ``version`` (``current_version``: their own
        newest, else the shared one's if they share, else fresh), keeping the leaving owner's
        Adam moments and putting back the arriving owner's only if built on these very weights."""
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        if inner.state:
            state = inner.state_dict()
            state["state"] = {i: {k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v
                                  for k, v in st.items()} for i, st in state["state"].items()}
            self.moments[self.owner] = (self.current.version, state)
        self._restore(version)
        saved = self.moments.pop(owner, None)
        if saved is not None and saved[0] == version.version:
            inner.load_state_dict(saved[1])  # moved back onto each parameter's device
        self.owner = owner
        self.policy.teacher.restart()

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


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # NaN / inf are not JSON
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
