"""The policy being trained, its OPD teacher and its optional KL reference.

Full fine-tuning trains every weight of a ``transformers`` causal LM. LoRA wraps the base model
with PEFT (``get_peft_model``); checkpoints are then adapters, merged by the engine into its base.

The teacher is "the model with the hint in its context"; which *weights* it uses is
``trainer.teacher``:

- ``current`` (default): the policy itself, evaluated under ``no_grad`` before the step. It costs no
  memory (on one GPU a second full copy of a 4B model does not fit beside the optimizer), the
  teacher - student gap is then exactly the effect of the hint on the weights being served, and the
  signal fades once the policy has absorbed the hint, which is the goal. The clipped ratio and the
  clipped gap bound how far one step moves it. This is also OpenClaw-RL's teacher.
- ``base``: the frozen starting model. Stable, but it keeps pulling the policy back toward the
  base model's style on every hinted token. Free with LoRA (TRL's ``use_adapter(model, None)``
  disables the adapter); a second full copy with full fine-tuning.
- ``ema``: an exponential moving average of the policy (TRL's self-distillation default). Full
  fine-tuning keeps a copy updated with TRL's ``SyncRefModelCallback.sync_target_model``; LoRA keeps
  a second "teacher" adapter averaged by TRL's ``PEFTAdapterEMACallback``. The average restarts
  from the published weights when the trainer restarts.

A user's active preferences are taught by the base model under LoRA, whatever this says (``Teacher.teacher_model``).

The KL reference (``kl_coef`` > 0) is always the base model.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from clawproxy.engine.model import torch_dtype
from clawproxy.errors import ConfigError
from trainer.checkpoints import Version
from trainer.config import TrainerConfig

log = logging.getLogger(__name__)

TEACHER_ADAPTER = "teacher"


def load_tokenizer(base_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base_dir))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_policy(cfg: TrainerConfig, base_dir: Path, current: Version) -> tuple[torch.nn.Module, dict[str, torch.Tensor] | None]:
    """Load the weights the engine is serving (``current``) as a trainable model. With LoRA, also
    the fresh adapter's weights (PEFT's seeded init, on the CPU): what version 0 means for an
    adapter, so a new adapter never starts from weights another owner trained."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.seed)
    fresh: dict[str, torch.Tensor] | None = None
    if cfg.finetune == "full":
        if current.lora:  # switching from LoRA to full: start from base + adapter, merged
            from peft import PeftModel

            base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch_dtype(cfg.dtype))
            model = PeftModel.from_pretrained(base, str(current.path)).merge_and_unload()
        else:
            model = AutoModelForCausalLM.from_pretrained(str(current.path), dtype=torch_dtype(cfg.dtype))
    else:
        if current.version > 0 and not current.lora:
            raise ConfigError(
                f"trainer.finetune=lora but the current version v{current.version} is a full checkpoint; "
                "keep finetune=full, or `clawproxy rollback 0` to start LoRA from the base model."
            )
        from peft import LoraConfig, get_peft_model

        base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch_dtype(cfg.dtype))
        targets: Any = cfg.lora_target_modules
        if targets != "all-linear":
            targets = [t.strip() for t in targets.split(",") if t.strip()]
        lora = LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
            target_modules=targets, task_type="CAUSAL_LM",
        )
        model = get_peft_model(base, lora)
        fresh = adapter_state(model)
        if current.version > 0:
            load_version_into(model, current, base_dir)
    if cfg.gradient_checkpointing:
        # non-reentrant: a LoRA model's frozen embeddings give the checkpointed blocks no input grad
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    from trl.trainer.utils import disable_dropout_in_model

    disable_dropout_in_model(model)  # the ratio to the engine's log-probs assumes no dropout noise
    model.train()
    return model, fresh


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of the trained adapter's weights (PEFT's state dict of the ``default`` adapter)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().to("cpu", copy=True) for k, v in get_peft_model_state_dict(model).items()}


def load_version_into(model: torch.nn.Module, version: Version, base_dir: Path, sharded: bool = False,
                      fresh: dict[str, torch.Tensor] | None = None) -> None:
    """Overwrite the policy's trainable weights in place with a version from disk.

    Used after a refused step (back to the last published weights), when someone else changed
    the serving version (a rollback), and when the trainer turns to another owner's adapter. In
    place, so the accelerate-prepared model and optimizer stay. LoRA version 0 is ``fresh``
    (``load_policy``'s), else just B = 0.
    """
    from safetensors.torch import load_file

    is_lora = hasattr(model, "peft_config")
    with torch.no_grad():
        if is_lora:
            if version.version == 0 and fresh is not None:
                from peft import set_peft_model_state_dict

                set_peft_model_state_dict(model, fresh)
                return
            if version.version == 0:  # LoRA's init: B = 0 makes the adapter a no-op
                for name, p in model.named_parameters():
                    if "lora_B" in name and f".{TEACHER_ADAPTER}." not in name:
                        p.zero_()
                return
            if not version.lora:
                raise ConfigError(f"v{version.version} is a full checkpoint; a LoRA policy cannot load it.")
            from peft import set_peft_model_state_dict

            adapter = load_file(str(Path(version.path) / "adapter_model.safetensors"))
            result = set_peft_model_state_dict(model, adapter)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise ConfigError(f"adapter v{version.version} does not fit this LoRA config: {unexpected[:3]}")
            return
        if version.lora:
            raise ConfigError(f"v{version.version} is a LoRA adapter; a full-fine-tuning policy cannot load it.")
        files = sorted(Path(version.path).glob("*.safetensors"))
        if not files:
            raise ConfigError(f"{version.path} has no safetensors files")
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        if sharded:  # FSDP2: every process loads the full tensors into its DTensor shards
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
            )

            result = set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))
            missing, unexpected = result.missing_keys, result.unexpected_keys
        else:
            missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied embeddings
        if missing or unexpected:
            raise ConfigError(f"v{version.version} does not match the model: missing={missing[:3]} unexpected={unexpected[:3]}")


class Teacher:
    """Gives the OPD teacher's forward pass (and the KL reference's) for a policy."""

    def __init__(self, cfg: TrainerConfig, policy: torch.nn.Module, base_dir: Path, device: Any):
        self.weights = cfg.teacher  # which weights teach: base | ema | current (trainer.teacher)
        self.rate = cfg.ema_rate
        self.policy = policy
        self.is_lora = hasattr(policy, "peft_config")
        self._copy: torch.nn.Module | None = None  # base or ema weights, full fine-tuning only
        self._ema_callback: Any = None
        self._steps = 0
        needs_base = self.weights == "base" or cfg.kl_coef > 0
        if self.is_lora:
            if self.weights == "ema":
                from trl.import_utils import TRLExperimentalWarning

                with warnings.catch_warnings():
                    # chosen knowingly (the docstring says why); TRL's "unstable API" notice is not the user's to act on
                    warnings.simplefilter("ignore", TRLExperimentalWarning)
                    from trl.experimental.sdpo.teacher_sync import PEFTAdapterEMACallback

                self._ema_callback = PEFTAdapterEMACallback(
                    policy, teacher_adapter_name=TEACHER_ADAPTER, update_rate=self.rate
                )
                self._ema_callback._initialize_teacher_adapter()
        else:
            if self.weights == "ema":
                self._copy = copy.deepcopy(policy).eval().requires_grad_(False)
            elif needs_base:
                from transformers import AutoModelForCausalLM

                self._copy = (
                    AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=next(policy.parameters()).dtype)
                    .to(device).eval().requires_grad_(False)
                )
        self._base_copy = self._copy if self.weights == "base" else None
        if cfg.kl_coef > 0 and not self.is_lora and self._base_copy is None:
            from transformers import AutoModelForCausalLM

            self._base_copy = (
                AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=next(policy.parameters()).dtype)
                .to(device).eval().requires_grad_(False)
            )

    @contextlib.contextmanager
    def teacher_model(self, policy: torch.nn.Module, *, distilled: bool = False) -> Iterator[torch.nn.Module]:
        """The model to score the hinted prompt with (use under ``torch.no_grad``).

        ``distilled``: the hint is the owner's active preferences. Under LoRA the base model teaches
        them (the adapter disabled, free): the adapter then learns to answer as the base does when
        told, and stops there. The policy's own told answer would be a moving target that "shorter"
        makes shorter at every step. Full fine-tuning keeps ``trainer.teacher`` (a base copy is not free)."""
        from trl.trainer.utils import use_adapter

        if distilled and self.is_lora:
            with use_adapter(unwrap(policy), None):
                yield policy
        elif self.weights == "current":
            yield policy
        elif self.is_lora:
            with use_adapter(unwrap(policy), None if self.weights == "base" else TEACHER_ADAPTER):
                yield policy
        else:
            assert self._copy is not None
            yield self._copy

    @contextlib.contextmanager
    def reference_model(self, policy: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """The base model, for the KL penalty."""
        from trl.trainer.utils import use_adapter

        if self.is_lora:
            with use_adapter(unwrap(policy), None):
                yield policy
        else:
            assert self._base_copy is not None
            yield self._base_copy

    def restart(self) -> None:
        """Start the EMA teacher over (as a restarted trainer does): after the policy turned to
        another owner's adapter, whose teacher must not average in the last owner's weights."""
        if self.weights != "ema" or not self.is_lora:  # full fine-tuning has one owner (users need LoRA)
            return
        from peft import set_peft_model_state_dict

        shadow = self._ema_callback.shadow_weights or {}
        for v in shadow.values():
            v.zero_()
        model = unwrap(self.policy)
        original = model.active_adapter
        model.set_adapter(TEACHER_ADAPTER)
        set_peft_model_state_dict(model, shadow, adapter_name=TEACHER_ADAPTER)
        model.set_adapter(original)

    def after_step(self, policy: torch.nn.Module) -> None:
        """Advance the EMA teacher after a published step."""
        self._steps += 1
        if self.weights != "ema":
            return
        if self.is_lora:
            self._ema_callback.on_step_end(None, SimpleNamespace(global_step=self._steps), None)
        else:
            from trl.trainer.callbacks import SyncRefModelCallback

            SyncRefModelCallback.sync_target_model(unwrap(policy), self._copy, self.rate)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module under DDP/FSDP wrappers (accelerate's ``unwrap_model`` without the Accelerator)."""
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model)


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
