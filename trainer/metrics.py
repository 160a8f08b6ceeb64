"""One step's figures: ``StepMetrics`` (every number a step produces, summed over micro-batches and
processes; ``as_dict`` is what ``train_steps.metrics`` stores) and ``StepResult`` (what a step did)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch

from trainer.batch import Sample


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
    objectives: dict[str, int] = field(default_factory=dict)  # samples per objective: rl, rl_opd, opd
    score_mean: float = 0.0
    score_baseline: float = 0.0
    skipped: dict[str, int] = field(default_factory=dict)
    kl_to_reference: bool = False  # kl_coef > 0: "kl" is the KL to the base model, else to the behaviour
    lr: float = 0.0
    grad_norm: float = 0.0
    train_s: float = 0.0
    # the gate and the publish
    gate: dict[str, Any] | None = None
    gate_s: float | None = None  # the gate's checks on the new weights (its canaries generated once)
    canary_s: float | None = None  # the serving version's canary answers, when not kept from before
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
            "kinds": self.objectives,  # the stored metrics key: existing databases and reports read it
            "score_baseline": self.score_baseline,
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "train_s": self.train_s,
            "tokens_per_s": int(self.tokens) / max(self.train_s, 1e-9),
            "skipped": self.skipped,
            "samples": self.samples,
        }
        for key in ("gate", "gate_s", "canary_s", "save_s", "reload_s", "publish_s", "batch_to_serving_s", "save_error", "engine_error"):
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
