"""The training loop: wait for a batch, one optimizer step, gate, publish. Read top to bottom.

    Trainer(cfg, store, engine)      load the serving version's weights (crash-safe resume)
    Trainer.run(follow, steps)       loop:
        sync()                         another process rolled back? reload; engine restarted? re-push
        collect()                      batch_size useful samples from the store (skips recorded)
        step(samples)                  teacher pass, clipped surrogate, backward, clip, AdamW step
        gate + publish                 checkpoint v<N+1> (atomic) -> gate -> engine reload -> rows
                                       a refused step restores the last published weights

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
processes (the main process reads the store and broadcasts the batch; it alone writes).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from clawproxy.config import Config
from clawproxy.engine.model import torch_dtype
from clawproxy.errors import EngineError
from clawproxy.store import Store
from trainer import gate
from trainer.batch import Sample, select_samples, teacher_prompt_ids
from trainer.checkpoints import (
    Version,
    checkpoints_root,
    current_version,
    ensure_engine_serves,
    is_refusal,
    next_version,
    prune,
    publish,
    publish_lock,
    validate_checkpoint,
    write_atomically,
)
from trainer.losses import (
    combined_advantages,
    completion_logps,
    make_token_batch,
    pad_floats,
    ppo_clipped_loss,
)
from trainer.policy import (
    TEACHER_ADAPTER,
    Teacher,
    load_policy,
    load_tokenizer,
    load_version_into,
    unwrap,
)

log = logging.getLogger(__name__)
MIN_LR_SCALE = 1 / 8  # refusal_backoff never takes the learning rate below this share of it


@dataclass
class StepResult:
    step_id: int | None
    status: str  # published | gate_failed | error | superseded (a rollback came first)
    base_version: int
    new_version: int | None
    metrics: dict[str, Any] = field(default_factory=dict)


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
        self.accelerator = accelerator or Accelerator()
        self.base_dir = local_model_dir(resolve_model(cfg.engine.model, cfg.data_path))
        self.ckpt_root = checkpoints_root(cfg.data_path)
        self.tokenizer = load_tokenizer(self.base_dir)
        self.current: Version = current_version(store, self.base_dir)
        model = load_policy(self.tcfg, self.base_dir, self.current).to(self.accelerator.device)
        self.teacher = Teacher(self.tcfg, model, self.base_dir, self.accelerator.device)
        params = [p for n, p in model.named_parameters() if p.requires_grad and f".{TEACHER_ADAPTER}." not in n]
        optimizer = torch.optim.AdamW(params, lr=self.tcfg.learning_rate, weight_decay=self.tcfg.weight_decay)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.params = params
        self.canary: gate.CanaryReference | None = None
        self.skipped_since_last_step: Counter[str] = Counter()
        self.is_lora = self.tcfg.finetune == "lora"
        log.info("trainer ready: %s from v%d (%s), teacher=%s, method=%s",
                 self.tcfg.finetune, self.current.version, self.current.path, self.tcfg.teacher, self.tcfg.method)

    # -- the loop ----------------------------------------------------------------------------

    def run(
        self, follow: bool = False, steps: int | None = None,
        on_step: Callable[[StepResult], None] | None = None,
        on_wait: Callable[[int], None] | None = None,
    ) -> list[StepResult]:
        """Train while full batches are available (``follow``: wait for more, forever or ``steps``)."""
        results: list[StepResult] = []
        while steps is None or len(results) < steps:
            self.sync()
            self._ensure_canary()  # off the critical path: computed while waiting for samples
            samples = self.collect()
            if len(samples) < self.tcfg.batch_size:
                if not follow:
                    break
                if on_wait:
                    on_wait(len(samples))
                time.sleep(self.tcfg.poll_interval_s)
                continue
            if self.engine is not None and not self._main_says(self.engine.health):
                # publishing would fail: wait for the engine (the supervisor restarts it)
                if not follow:
                    raise EngineError(f"engine at {self.engine.base_url} is not answering /health")
                log.warning("engine not healthy; waiting before training")
                time.sleep(self.tcfg.poll_interval_s)
                continue
            result = self.step(samples)
            results.append(result)
            if on_step:
                on_step(result)
            if follow and result.status == "error":  # the same samples wait for the disk or the engine
                time.sleep(self.tcfg.poll_interval_s)
        return results

    def sync(self) -> None:
        """Follow the store's current version (a rollback by `clawproxy rollback` while we run) and
        make sure a restarted engine serves it again."""
        latest = self._main_says(lambda: current_version(self.store, self.base_dir))
        if latest.version != self.current.version:
            log.info("serving version changed to v%d outside this trainer; reloading it", latest.version)
            self._restore(latest)
        if self.engine is not None and self.accelerator.is_main_process:
            try:
                ensure_engine_serves(self.store, self.engine, self.base_dir)
            except EngineError as e:
                log.warning("engine did not take v%d back: %s", self.current.version, e.message)

    def _main_says(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` evaluated by the main process and shared, so every process takes the same branch
        (a process that decides differently would hang the others in the next collective)."""
        if self.accelerator.num_processes == 1:
            return fn()
        from accelerate.utils import broadcast_object_list

        box = [fn() if self.accelerator.is_main_process else None]
        broadcast_object_list(box)
        return box[0]

    def collect(self) -> list[Sample]:
        """The next ``batch_size`` useful samples (main process reads, everyone gets the same list)."""

        def read() -> list[Sample]:
            sel = select_samples(self.store, self.tcfg, self.current.version)
            samples = []
            for s in sel.samples:
                if len(samples) == self.tcfg.batch_size:
                    break
                problem = self._teacher_problem(s)
                if problem:
                    sel.skipped[s.turn_id] = problem
                else:
                    samples.append(s)
            if sel.skipped:
                self.store.record_skipped(sel.skipped)
                self.skipped_since_last_step.update(sel.skipped.values())
            return samples

        return self._main_says(read)

    def _teacher_problem(self, s: Sample) -> str | None:
        """``teacher_too_long`` when the OPD teacher's prompt (the recorded one plus the hint) and the
        completion exceed ``max_seq_len`` (the teacher pass would cost more than the trainer allows);
        ``no_teacher`` when a distillation-only sample has no teacher prompt (it would train nothing)."""
        if self.tcfg.method == "rl" or not s.hint:
            return None
        ids = teacher_prompt_ids(self.tokenizer, s)
        if ids is None:
            return "no_teacher" if s.kind == "opd" else None
        return "teacher_too_long" if len(ids) + len(s.completion_ids) > self.tcfg.max_seq_len else None

    # -- one step ----------------------------------------------------------------------------

    def step(self, samples: list[Sample]) -> StepResult:
        batch_ready = time.time()
        acc = self.accelerator
        self._ensure_canary()

        t0 = time.perf_counter()
        baselines = self._main_says(lambda: self.score_baselines(samples))
        lr = self._main_says(self.step_learning_rate)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        m = self.forward_backward(samples, baselines)
        grad_norm = float(acc.clip_grad_norm_(self.params, self.tcfg.max_grad_norm))
        if math.isfinite(m["loss"]) and math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        train_s = time.perf_counter() - t0
        m.update(lr=lr, grad_norm=grad_norm, train_s=train_s, tokens_per_s=m["tokens"] / max(train_s, 1e-9),
                 skipped=dict(self.skipped_since_last_step), samples=len(samples))

        report, new_ref = gate.check(
            self._no_sync_model(), self.tokenizer, self.tcfg, self.canary, loss=m["loss"], grad_norm=grad_norm, accelerator=acc
        )
        m["gate"] = report.as_dict()
        if not report.ok:
            return self._refuse(samples, m, report)
        return self._publish(samples, m, new_ref, batch_ready)

    def _ensure_canary(self) -> None:
        """The serving version's canary answers, the gate's point of comparison."""
        if self.canary is None or self.canary.version != self.current.version:
            self.canary = gate.canary_reference(
                self._no_sync_model(), self.tokenizer, self.tcfg, self.current.version, self.accelerator
            )

    def step_learning_rate(self) -> float:
        """``learning_rate``, backed off by ``refusal_backoff`` per gate refusal in a row from the
        serving version (read from the store, so a restart keeps it), never below 1/8 of it."""
        lr, factor = self.tcfg.learning_rate, self.tcfg.refusal_backoff
        if factor >= 1:
            return lr
        rows = self.store.recent_steps(16)
        refused = 0
        for r in rows:
            if r["status"] != "gate_failed" or r["base_version"] != self.current.version:
                break
            refused += 1
        return lr * max(factor**refused, MIN_LR_SCALE)

    def score_baselines(self, samples: list[Sample]) -> dict[int, float]:
        """Each sample's RL baseline, leave-one-out (RLOO): the mean non-zero judge score of the
        other RL samples in this batch and the last ``baseline_window`` trained before it (a
        distillation-only sample has no score to share, whatever the judge said). Leaving
        the sample itself out keeps the estimate unbiased; an all-fail (or all-pass) batch with no
        history then moves nothing by RL, as a zero-variance group does in GRPO. All 0 with a
        window of 0. History comes from the store, so a restart keeps it."""
        window = self.tcfg.baseline_window
        if window <= 0:
            return {s.turn_id: 0.0 for s in samples}
        pool = self.store.recent_trained_scores(window) + [s.score for s in samples if _rl_score(s)]
        total, n = sum(pool), len(pool)
        out = {}
        for s in samples:
            others = n - 1 if _rl_score(s) else n
            rest = total - s.score if _rl_score(s) else total
            out[s.turn_id] = rest / others if others else 0.0
        return out

    def forward_backward(self, samples: list[Sample], baselines: dict[int, float] | None = None) -> dict[str, Any]:
        """Accumulate gradients of the clipped surrogate over micro-batches; return step metrics.

        The RL term of a sample is ``score - baselines[turn_id]``, and 0 for a distillation-only
        sample (kind ``opd``: a cut-off answer or a score-0 turn, here only for its hint)."""
        baselines = baselines or {}
        acc, cfg = self.accelerator, self.tcfg
        world, rank = acc.num_processes, acc.process_index
        mine = samples[rank::world]
        mbs = cfg.micro_batch_size
        n_micro = math.ceil(math.ceil(len(samples) / world) / mbs)
        num_tokens = sum(len(s.completion_ids) for s in samples)  # global: token-level mean over the step
        pad_id = self.tokenizer.pad_token_id
        sums: Counter[str] = Counter()
        for i in range(n_micro):
            chunk = mine[i * mbs : (i + 1) * mbs]
            weight = 1.0
            if not chunk:  # uneven split: a zero-weight pass keeps collective ops in step
                chunk, weight = samples[:1], 0.0
            batch = make_token_batch([s.prompt_ids for s in chunk], [s.completion_ids for s in chunk], pad_id, acc.device)
            mask = batch.completion_mask.float()
            behaviour = pad_floats([s.behaviour_logps for s in chunk], acc.device)
            scores = torch.tensor(
                [s.score - baselines.get(s.turn_id, 0.0) if _rl_score(s) else 0.0 for s in chunk],
                device=acc.device)

            teacher_logps, has_teacher = self._teacher_logps(chunk, batch)
            ref_logps = None
            if cfg.kl_coef > 0:
                with torch.no_grad(), self.teacher.reference_model(self._no_sync_model()) as ref:
                    ref_logps = completion_logps(ref, batch)

            logps = completion_logps(self.model, batch)
            adv = combined_advantages(
                scores, teacher_logps, logps.detach(), has_teacher, mask,
                w_rl=cfg.w_rl if cfg.method != "opd" else 0.0,
                w_opd=cfg.w_opd if cfg.method != "rl" else 0.0,
                clip=cfg.opd_clip,
            )
            loss, st = ppo_clipped_loss(
                logps, behaviour, adv, mask, epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high,
                num_tokens=num_tokens, ref_logps=ref_logps, kl_coef=cfg.kl_coef,
            )
            acc.backward(loss * weight * world)  # DDP/FSDP average gradients over processes
            n = float(mask.sum()) * weight
            sums["loss"] += float(loss.detach()) * weight
            sums["tokens"] += sum(len(s.prompt_ids) + len(s.completion_ids) for s in chunk) * weight
            sums["completion_tokens"] += n
            sums["adv"] += float((adv * mask).sum()) * weight
            sums["clip"] += st.clip_frac * n
            sums["kl_behaviour"] += st.kl_behaviour * n
            sums["kl_ref"] += st.kl_ref * n
            sums["ratio"] += st.ratio_mean * n
            sums["opd_samples"] += float(has_teacher.sum()) * weight
            gap = ((teacher_logps - logps.detach()) * mask * has_teacher.float().unsqueeze(1)).sum()
            sums["opd_gap"] += float(gap) * weight
            sums["opd_tokens"] += float((mask * has_teacher.float().unsqueeze(1)).sum()) * weight
        if world > 1:
            keys = sorted(sums)
            vec = acc.reduce(torch.tensor([sums[k] for k in keys], device=acc.device, dtype=torch.float64), "sum")
            sums = Counter(dict(zip(keys, vec.tolist(), strict=True)))
        ct = max(sums["completion_tokens"], 1.0)
        return {
            "loss": sums["loss"],
            "adv_mean": sums["adv"] / ct,
            "clip_frac": sums["clip"] / ct,
            "kl": sums["kl_ref"] / ct if cfg.kl_coef > 0 else sums["kl_behaviour"] / ct,
            "kl_behaviour": sums["kl_behaviour"] / ct,
            "ratio_mean": sums["ratio"] / ct,
            "tokens": int(sums["tokens"]),
            "completion_tokens": int(sums["completion_tokens"]),
            "opd_samples": int(sums["opd_samples"]),
            "opd_gap_mean": sums["opd_gap"] / max(sums["opd_tokens"], 1.0),
            "score_mean": sum(s.score for s in samples) / len(samples),
            "kinds": dict(Counter(s.kind for s in samples)),
            "score_baseline": sum(baselines.values()) / len(baselines) if baselines else 0.0,
        }

    def _teacher_logps(self, chunk: list[Sample], batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher log-probs of the recorded completion tokens given the hinted prompt (no grad).

        Zeros (and has_teacher False) for samples without a hint or for method=rl."""
        dev = self.accelerator.device
        t_logps = torch.zeros(batch.completion_ids.shape, device=dev)
        has = torch.zeros(len(chunk), dtype=torch.bool, device=dev)
        if self.tcfg.method == "rl":
            return t_logps, has
        prompts = [teacher_prompt_ids(self.tokenizer, s) for s in chunk]
        idx = [i for i, p in enumerate(prompts) if p is not None]
        if not idx:
            if self.accelerator.num_processes == 1:
                return t_logps, has
            # FSDP all-gathers in every forward: every process must run the same passes, so a
            # micro-batch without hints still runs (and discards) one teacher pass
            with torch.no_grad(), self.teacher.teacher_model(self._no_sync_model()) as teacher:
                completion_logps(teacher, batch)
            return t_logps, has
        tb = make_token_batch([prompts[i] for i in idx], [chunk[i].completion_ids for i in idx],
                              self.tokenizer.pad_token_id, dev)
        with torch.no_grad(), self.teacher.teacher_model(self._no_sync_model()) as teacher:
            lp = completion_logps(teacher, tb)
        for row, i in enumerate(idx):
            n = len(chunk[i].completion_ids)
            t_logps[i, :n] = lp[row, :n]
            has[i] = True
        return t_logps, has

    def _no_sync_model(self) -> torch.nn.Module:
        """The model for gradient-free passes: under DDP the inner module, whose forward does no
        collective (DDP's would broadcast buffers); FSDP needs its wrapper to gather shards."""
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type == DistributedType.FSDP:
            return self.model
        return unwrap(self.model)

    # -- outcomes ----------------------------------------------------------------------------

    def _refuse(self, samples: list[Sample], m: dict[str, Any], report: gate.GateReport) -> StepResult:
        """A failed gate never publishes: log, record, and go back to the last published weights.

        The samples are marked used by this (refused) step: a batch that poisons the weights
        would otherwise be retried forever."""
        log.warning("publish gate refused step from v%d: %s", self.current.version, ", ".join(report.failed))
        step_id = None
        if self.accelerator.is_main_process:
            step_id = self._record(samples, m, "gate_failed", None)
            self.store.log_event("gate_failed", {"step_id": step_id, "base_version": self.current.version,
                                                 "failed": report.failed, "gate": report.as_dict()})
        self._restore(self.current)
        return StepResult(step_id, "gate_failed", self.current.version, None, m)

    def _publish(self, samples: list[Sample], m: dict[str, Any], new_ref: Any, batch_ready: float) -> StepResult:
        base = self.current.version
        t0 = time.perf_counter()
        # collective under FSDP (gathers the full weights), so every process calls it
        state_dict = self.accelerator.get_state_dict(self.model) if not self.is_lora else None
        status, version, step_id = self._main_says(
            lambda: self._write_and_reload(samples, m, state_dict, t0, batch_ready)
        )
        if status == "superseded":  # sync() loads the version now serving before the next step
            return StepResult(step_id, status, base, None, m)
        if status != "published":
            self._restore(self.current)
            return StepResult(step_id, status, base, None, m)
        self.current = Version(version, self.ckpt_root / f"v{version}", "lora" if self.is_lora else "full")
        self.teacher.after_step(self.model)
        new_ref.version = version
        self.canary = new_ref
        self.skipped_since_last_step.clear()
        return StepResult(step_id, "published", base, version, m)

    def _write_and_reload(
        self, samples: list[Sample], m: dict[str, Any], state_dict: dict[str, Any] | None, t0: float,
        batch_ready: float,
    ) -> tuple[str, int | None, int]:
        """Main process: checkpoint v<N> -> engine reload -> rows. Returns (status, version, step_id).

        Under the publish lock: a rollback made while this step trained wins ("superseded"; the
        samples stay untrained and are trained again from the version it put back)."""
        with publish_lock(self.store):
            latest = current_version(self.store, self.base_dir).version
            if latest != self.current.version:
                log.warning("v%d was published while this step trained from v%d; dropping the step",
                            latest, self.current.version)
                step_id = self._record([], m, "superseded", None)
                return "superseded", None, step_id
            return self._write_and_reload_locked(samples, m, state_dict, t0, batch_ready)

    def _write_and_reload_locked(
        self, samples: list[Sample], m: dict[str, Any], state_dict: dict[str, Any] | None, t0: float,
        batch_ready: float,
    ) -> tuple[str, int | None, int]:
        version = next_version(self.store)
        out_dir = self.ckpt_root / f"v{version}"
        try:
            write_atomically(out_dir, lambda tmp: self._save(tmp, state_dict))
        except OSError as e:  # disk full, read-only, permissions: the samples are not the problem
            why = e.strerror or str(e)
            log.error("could not write checkpoint v%d in %s (%s); keeping v%d. Free disk space there "
                      "(trainer.keep_checkpoints keeps fewer); the samples stay untrained and are "
                      "trained again.", version, self.ckpt_root, why, self.current.version)
            m["save_error"] = why
            step_id = self._record([], m, "error", None)
            self.store.log_event("checkpoint_write_failed", {"version": version, "error": why, "step_id": step_id})
            return "error", None, step_id
        m["save_s"] = time.perf_counter() - t0
        new = Version(version, out_dir, "lora" if self.is_lora else "full")
        try:
            if self.engine is not None:
                t_reload = time.perf_counter()
                publish(self.engine, new, self.current, self.base_dir)
                m["reload_s"] = time.perf_counter() - t_reload  # /metrics: engine reload durations
            else:
                validate_checkpoint(out_dir, new.kind, self.base_dir)
        except EngineError as e:
            log.error("engine did not take v%d: %s; keeping v%d", version, e.message, self.current.version)
            m["engine_error"] = e.message
            # refused (the checkpoint is the problem): the samples are used up; unreachable or
            # busy (502/503/504): the samples stay untrained and are retried
            consumed = samples if is_refusal(e) else []
            step_id = self._record(consumed, m, "error", None)
            self.store.log_event("reload_refused", {"version": version, "error": e.message, "step_id": step_id})
            shutil.rmtree(out_dir, ignore_errors=True)
            return "error", None, step_id
        m["publish_s"] = time.perf_counter() - t0
        m["batch_to_serving_s"] = time.time() - batch_ready
        step_id = self._record(samples, m, "published", version, out_dir)
        deleted = prune(self.store, self.tcfg.keep_checkpoints, self.ckpt_root)
        if deleted:
            log.info("deleted old checkpoints %s", deleted)
        return "published", version, step_id

    def _save(self, tmp: Path, state_dict: dict[str, Any] | None) -> None:
        model = unwrap(self.model)
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
        self.tokenizer.save_pretrained(str(tmp))

    def _record(self, samples: list[Sample], m: dict[str, Any], status: str, version: int | None,
                out_dir: Path | None = None) -> int:
        """One transaction: the step, the samples it consumed, and (published) the checkpoint row."""
        published = status == "published" and version is not None
        return self.store.record_step(
            method=self.tcfg.method, base_version=self.current.version, new_version=version, status=status,
            metrics=_jsonable(m), kinds={s.turn_id: s.kind for s in samples},
            checkpoint={"path": str(out_dir), "kind": "lora" if self.is_lora else "full",
                        "gate": _jsonable(m["gate"]), "engine": self.engine is not None} if published else None,
        )

    def _restore(self, version: Version) -> None:
        """Put ``version``'s weights back into the policy and forget the optimizer's moments."""
        from accelerate.utils import DistributedType

        sharded = self.accelerator.distributed_type == DistributedType.FSDP
        load_version_into(unwrap(self.model), version, self.base_dir, sharded=sharded)
        self.optimizer.zero_grad(set_to_none=True)
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        inner.state.clear()
        self.current = version
        self.canary = None  # recomputed from the restored weights before the next step


def _rl_score(s: Sample) -> int:
    """The score the RL term uses: 0 for a distillation-only sample."""
    return 0 if s.kind == "opd" else s.score


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
