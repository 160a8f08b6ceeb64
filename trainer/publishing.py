"""Publishing a step that passed the gate: checkpoint v<N> (atomic), the engine's reload, then the
step's rows in one transaction. Main process only; ``Trainer.step`` shares the outcome.

Every way it can end is a status: published; superseded (a rollback made while the step trained
wins, and its samples are trained again from the version it put back); user_removed (nothing of
theirs may be written or served); error (a full disk or an unreachable engine leave the samples
untrained; a checkpoint the engine refuses uses them up, or a batch that poisons the weights would
be retried forever).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clawproxy.config import Config
from clawproxy.engine.client import Engine
from clawproxy.engine.model import torch_dtype
from clawproxy.errors import EngineError
from clawproxy.store import Store
from trainer.batch import Sample
from trainer.checkpoints import (
    Version,
    current_version,
    is_refusal,
    next_version,
    prune,
    publish,
    validate_checkpoint,
    write_atomically,
)
from trainer.holding import Holding
from trainer.metrics import StepMetrics
from trainer.policy import Policy, unwrap

log = logging.getLogger(__name__)


class Publisher:
    """Writes, reloads and records the policy's weights for the owner ``Holding`` names."""

    def __init__(self, cfg: Config, store: Store, engine: Engine | None, policy: Policy, base_dir: Path,
                 ckpt_root: Path):
        self.cfg, self.tcfg = cfg, cfg.trainer
        self.store, self.engine, self.policy = store, engine, policy
        self.base_dir, self.ckpt_root = base_dir, ckpt_root
        self.is_lora = self.tcfg.finetune == "lora"

    def publish(
        self, held: Holding, samples: list[Sample], m: StepMetrics, state_dict: dict[str, Any] | None,
        t0: float, batch_ready: float, on_published: Callable[[StepMetrics], None],
    ) -> tuple[str, int | None, int | None, StepMetrics]:
        """Checkpoint v<N> -> engine reload -> rows, under the publish lock. Returns (status,
        version, step_id, the metrics with the publish's figures)."""
        with self.store.publish_lock():
            if held.owner is not None and self.store.get_user(held.owner) is None:
                log.warning("user %s was removed while this step trained; dropping it", held.owner)
                return "user_removed", None, None, m
            latest = current_version(self.store, self.base_dir, held.owner).version
            if latest != held.current.version:
                log.warning("v%d was published while this step trained from v%d; dropping the step",
                            latest, held.current.version)
                return "superseded", None, self.record(held, [], m, "superseded", None), m
            version = next_version(self.store)
            out_dir = self.ckpt_root / f"v{version}"
            try:
                write_atomically(out_dir, lambda tmp: self.save(tmp, state_dict))
            except OSError as e:  # disk full, read-only, permissions: the samples are not the problem
                why = e.strerror or str(e)
                log.error("could not write checkpoint v%d in %s (%s); keeping v%d. Free disk space there "
                          "(trainer.keep_checkpoints keeps fewer); the samples stay untrained and are "
                          "trained again.", version, self.ckpt_root, why, held.current.version)
                m.save_error = why
                step_id = self.record(held, [], m, "error", None)
                self.store.log_event("checkpoint_write_failed", {"version": version, "error": why, "step_id": step_id})
                return "error", None, step_id, m
            m.save_s = time.perf_counter() - t0
            new = Version(version, out_dir, "lora" if self.is_lora else "full")
            try:
                if self.engine is not None:
                    t_reload = time.perf_counter()
                    publish(self.engine, new, held.current, self.base_dir, held.owner)
                    m.reload_s = time.perf_counter() - t_reload  # /metrics: engine reload durations
                else:
                    validate_checkpoint(out_dir, new.format, self.base_dir)
            except EngineError as e:
                log.error("engine did not take v%d: %s; keeping v%d", version, e.message, held.current.version)
                m.engine_error = e.message
                # refused (the checkpoint is the problem): the samples are used up; unreachable or
                # busy (502/503/504): the samples stay untrained and are retried
                step_id = self.record(held, samples if is_refusal(e) else [], m, "error", None)
                self.store.log_event("reload_refused", {"version": version, "error": e.message, "step_id": step_id})
                shutil.rmtree(out_dir, ignore_errors=True)
                return "error", None, step_id, m
            m.publish_s = time.perf_counter() - t0
            m.batch_to_serving_s = time.time() - batch_ready
            step_id = self.record(held, samples, m, "published", version, out_dir)
            on_published(m)
            deleted = prune(self.store, self.tcfg.keep_checkpoints, self.ckpt_root)
            if deleted:
                log.info("deleted old checkpoints %s", deleted)
            return "published", version, step_id, m

    def save(self, tmp: Path, state_dict: dict[str, Any] | None) -> None:
        """The policy's weights and tokenizer into ``tmp``: a flat PEFT adapter, or the full model."""
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

    def record(self, held: Holding, samples: list[Sample], m: StepMetrics, status: str, version: int | None,
               out_dir: Path | None = None) -> int:
        """One transaction: the step, the samples it consumed, and (published) the checkpoint row."""
        published = status == "published" and version is not None
        return self.store.record_step(
            method=self.tcfg.method, base_version=held.current.version, new_version=version, status=status,
            metrics=_jsonable(m.as_dict()), objectives={s.turn_id: s.objective for s in samples},
            checkpoint={"path": str(out_dir), "format": "lora" if self.is_lora else "full",
                        "gate": _jsonable(m.gate), "engine": self.engine is not None} if published else None,
            owner=held.owner,
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # NaN / inf are not JSON
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
