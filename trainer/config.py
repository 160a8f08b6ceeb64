"""Trainer configuration (one dataclass; see clawproxy.config for how it is loaded and validated).

Field names follow TRL's ``GRPOConfig`` where the meaning is the same (``epsilon_low``,
``epsilon_high``, ``beta`` is called ``kl_coef`` here, ``max_grad_norm``), and TRL's self-distillation
configs for the teacher (``teacher_model_kind`` base|live|ema is ``teacher`` base|current|ema here,
``teacher_update_rate`` is ``ema_rate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from clawproxy.fields import STRICT, setting

# A canary needs a stable greedy answer and a clean base answer, or any step flips it to "newly"
# degenerate; open-ended ones show the loops that short answers never do (bench/results/README.md).
DEFAULT_CANARIES = [
    "What is the capital of Japan?",
    "Write one sentence about the sea.",
    "Give me three tips for drinking more water.",
    "How do I plan a weekend trip?",
    "What are good habits for studying?",
]


@dataclass
class TrainerConfig:
    __pydantic_config__ = STRICT

    enabled: bool = setting(True, "Run the trainer under `clawproxy start`.")
    method: Literal["rl", "opd", "combined"] = setting(
        "combined", "'rl' (binary RL), 'opd' (on-policy distillation) or 'combined'."
    )
    batch_size: int = setting(
        4, "Useful samples per optimizer step (score-0 turns without a hint do not count).", ge=1
    )
    micro_batch_size: int = setting(
        1, "Samples per forward/backward pass when pack_prefixes is off; gradients accumulate over the "
        "batch. 1 avoids padding on CPU.",
        ge=1,
    )
    pack_prefixes: bool = setting(
        True, "Fold the samples of a step into token tries, so a prefix they share (OpenClaw's system "
        "prompt, an earlier turn) is computed once; the log-probs and gradients are the unpacked ones. "
        "Needs sdpa or eager attention (else off); single-process only. Replaces micro_batch_size.",
    )
    pack_tokens: int = setting(
        8192, "pack_prefixes: most tokens in one packed pass (its trie); more samples go into the next pass.",
        ge=1,
    )
    learning_rate: float = setting(
        2e-5,
        "AdamW learning rate: 2e-5 for full fine-tuning of the 135M default (measured in "
        "bench/results/README.md); LoRA usually wants ~1e-4.",
        gt=0,
    )
    refusal_backoff: float = setting(
        0.5,
        "After the publish gate refuses a step, the next step from the same version trains at "
        "learning_rate x this, per refusal in a row (at least 1/8 of the rate); a published step "
        "restores the full rate. A refused step restores the weights and Adam's moments, so each retry "
        "is a first Adam step, which moves every weight by ~lr whatever the gradient. 1: off.",
        gt=0, le=1,
    )
    weight_decay: float = setting(0.0, "AdamW weight decay.", ge=0)
    max_grad_norm: float = setting(1.0, "Gradient norm clip (the pre-clip norm is logged and gated).", gt=0)
    max_staleness: int = setting(4, "Drop samples generated more than this many weight versions ago.", ge=0)
    max_seq_len: int = setting(
        8192, "Drop samples whose prompt + completion is longer than this (reason too_long). The default "
        "holds a whole OpenClaw turn of the default model (8k context); on CPU a 7k-token sample "
        "peaks near 14 GB (full fine-tuning): lower it on smaller machines.", ge=1
    )
    epsilon_low: float = setting(
        0.2, "PPO clip: the ratio to the behaviour policy is kept above 1 - epsilon_low.", ge=0, lt=1
    )
    epsilon_high: float = setting(
        0.28, "PPO clip: the ratio is kept below 1 + epsilon_high (DAPO's clip-higher).", ge=0
    )
    kl_coef: float = setting(0.0, "Weight of the k3 KL penalty to the base model (0: off, no reference pass).", ge=0)
    baseline_window: int = setting(
        32,
        "Binary RL baseline: the advantage is score - the leave-one-out mean (RLOO) of the other non-zero "
        "scores in the batch and the last N trained before it; the history stands in for GRPO's group, "
        "since each prompt has one answer. 0: the raw score.",
        ge=0,
    )
    w_rl: float = setting(1.0, "combined: weight of the judge score in the per-token advantage.")
    w_opd: float = setting(1.0, "combined: weight of (teacher - student) log-prob in the per-token advantage.")
    opd_clip: float = setting(
        1.0, "Clip of the per-token teacher - student log-prob gap, so OPD and RL terms share a scale.", gt=0
    )
    teacher: Literal["current", "base", "ema"] = setting(
        "current",
        "OPD teacher weights for the judge's hints: 'current' (the policy itself with the hint in context; "
        "no extra memory), 'base' (the frozen starting model) or 'ema' (an exponential average of the policy). "
        "Under LoRA a user's active preferences are always taught by the base model.",
    )
    ema_rate: float = setting(0.05, "teacher=ema: update rate per step (TRL's teacher_update_rate).", gt=0, le=1)
    finetune: Literal["auto", "full", "lora"] = setting(
        "auto", "'full' fine-tuning, 'lora' (PEFT adapter; checkpoints are adapters), or auto: the "
        "named model's choice (lora where full fine-tuning does not fit 24 GB), else full."
    )
    lora_r: int = setting(16, "LoRA rank.", ge=1)
    lora_alpha: int = setting(32, "LoRA alpha.", ge=1)
    lora_dropout: float = setting(0.0, "LoRA dropout.", ge=0, lt=1)
    lora_target_modules: str = setting("all-linear", "PEFT target_modules ('all-linear' or comma-separated names).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = setting(
        "auto", "Dtype the trainer loads the model in. auto: bfloat16 under a LoRA adapter (its own weights "
        "stay float32) on a GPU or a CPU with bfloat16 instructions (AVX512-BF16, AMX), else float32."
    )
    gradient_checkpointing: bool = setting(False, "Trade compute for memory on long sequences.")
    keep_checkpoints: int = setting(
        5, "Published checkpoints kept on disk (K; at least 1, the current one); older dirs are deleted.", ge=1
    )
    poll_interval_s: float = setting(5.0, "Seconds between store polls while waiting for a batch.", gt=0)
    canary_prompts: list[str] = setting(
        DEFAULT_CANARIES, "Prompts the publish gate generates from (a list of strings).", min_length=1
    )
    canary_max_tokens: int = setting(
        96, "Greedy tokens generated per canary prompt by the gate (loops show after a few sentences).", ge=1
    )
    gate_max_kl: float = setting(
        0.5, "Gate: largest mean per-token KL(previous || new) on the canary continuations.", ge=0
    )
    seed: int = setting(0, "Random seed (LoRA init, dropout).")
    threads: int | None = setting(
        None,
        "CPU threads for torch (None: torch's default, all cores). On a CPU shared with the engine, "
        "1 avoids thread oversubscription.",
        ge=1,
    )
