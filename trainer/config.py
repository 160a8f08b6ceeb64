"""Trainer configuration (one dataclass; see clawproxy.config for how it is loaded).

Field names follow TRL's ``GRPOConfig`` where the meaning is the same (``epsilon_low``,
``epsilon_high``, ``beta`` is called ``kl_coef`` here, ``max_grad_norm``), and TRL's self-distillation
configs for the teacher (``teacher_model_kind`` base|live|ema is ``teacher`` base|current|ema here,
``teacher_update_rate`` is ``ema_rate``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clawproxy.errors import ConfigError

DEFAULT_CANARIES = [
    # A canary needs a stable greedy answer, or any step flips it. "What is the capital of France?"
    # had none: the default model's first token is "The" at p=0.152 against "L" at 0.140, and a
    # step of any size tipped it into a looping French answer ("L'Étoile, la femme, la femme, ..."),
    # 9 of the 12 refusals in seven personalization runs, up to 4 in a row from one version.
    # Japan's first-token margin is 0.67 ("The capital of Japan is Tokyo."). "List three colors."
    # caused the other 3: its base answer already repeats itself ("1. Red: The most popular color
    # among the 11 colors of the rainbow. 2. Blue: The most popular color among ..."), so any step
    # could make it "newly" degenerate; the list canary is now one the base answers cleanly.
    "What is the capital of Japan?",
    "Write one sentence about the sea.",
    "Give me three tips for drinking more water.",
    # open-ended: where a small model pushed too far starts looping ("You can practice with a
    # guitar. You can also practice with a guitar. ..."), which short answers never show
    "How do I plan a weekend trip?",
    "What are good habits for studying?",
]


def _f(default, help_text: str):
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help_text})
    return field(default=default, metadata={"help": help_text})


@dataclass
class TrainerConfig:
    enabled: bool = _f(True, "Run the trainer under `clawproxy start`.")
    method: str = _f("combined", "'rl' (binary RL), 'opd' (on-policy distillation) or 'combined'.")
    batch_size: int = _f(4, "Useful samples per optimizer step (score-0 turns without a hint do not count).")
    micro_batch_size: int = _f(
        1, "Samples per forward/backward pass; gradients accumulate over the batch. 1 avoids padding on CPU."
    )
    learning_rate: float = _f(
        2e-5,
        "AdamW learning rate. 2e-5 for full fine-tuning of the 135M default (1e-5 did not move it in 36 "
        "simulated interactions, 5e-5 collapsed into loops, 3e-5 looped sooner once the judge stopped "
        "dropping praise); LoRA usually wants ~1e-4.",
    )
    refusal_backoff: float = _f(
        0.5,
        "After the publish gate refuses a step, the next step from the same version trains at "
        "learning_rate x this, per refusal in a row (at least 1/8 of the rate); a published step "
        "restores the full rate. A refused step restores the weights and Adam's moments, so each retry "
        "is a first Adam step, which moves every weight by ~lr whatever the gradient. 1: off.",
    )
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    max_grad_norm: float = _f(1.0, "Gradient norm clip (the pre-clip norm is logged and gated).")
    max_staleness: int = _f(4, "Drop samples generated more than this many weight versions ago.")
    max_seq_len: int = _f(4096, "Drop samples whose prompt + completion is longer than this (reason too_long).")
    truncated: str = _f(
        "skip",
        "Answers cut off at max_tokens: 'skip' never trains one; 'negative' trains one only when the "
        "judge scored it -1 (never reinforced). 'negative' spreads a -1 over hundreds of fluent tokens, "
        "which on the 135M default made greedy answers loop (38% of held-out answers after 3 steps, "
        "0% with 'skip', same recorded samples: bench/replay.py).",
    )
    epsilon_low: float = _f(0.2, "PPO clip: the ratio to the behaviour policy is kept above 1 - epsilon_low.")
    epsilon_high: float = _f(0.28, "PPO clip: the ratio is kept below 1 + epsilon_high (DAPO's clip-higher).")
    kl_coef: float = _f(0.0, "Weight of the k3 KL penalty to the base model (0: off, no reference pass).")
    loss_norm: str = _f(
        "token",
        "'token': the loss is a mean over every completion token of the step (DAPO/bnpo), 'sequence': "
        "a mean over samples of each one's token mean (GRPO's original), so long answers do not dominate.",
    )
    baseline_window: int = _f(
        32,
        "Binary RL baseline: the advantage is score - the leave-one-out mean (RLOO) of the other non-zero "
        "scores in the batch and the last N trained before it; the history stands in for GRPO's group, "
        "since each prompt has one answer. 0: the raw score.",
    )
    w_rl: float = _f(1.0, "combined: weight of the judge score in the per-token advantage.")
    w_opd: float = _f(1.0, "combined: weight of (teacher - student) log-prob in the per-token advantage.")
    opd_clip: float = _f(
        1.0, "Clip of the per-token teacher - student log-prob gap, so OPD and RL terms share a scale."
    )
    teacher: str = _f(
        "current",
        "OPD teacher weights: 'current' (the policy itself with the hint in context; no extra memory), "
        "'base' (the frozen starting model) or 'ema' (an exponential average of the policy).",
    )
    ema_rate: float = _f(0.05, "teacher=ema: update rate per step (TRL's teacher_update_rate).")
    finetune: str = _f("full", "'full' fine-tuning or 'lora' (PEFT adapter; checkpoints are adapters).")
    lora_r: int = _f(16, "LoRA rank.")
    lora_alpha: int = _f(32, "LoRA alpha.")
    lora_dropout: float = _f(0.0, "LoRA dropout.")
    lora_target_modules: str = _f("all-linear", "PEFT target_modules ('all-linear' or comma-separated names).")
    dtype: str = _f("float32", "Dtype the trainer loads weights in (bfloat16 on GPUs).")
    gradient_checkpointing: bool = _f(False, "Trade compute for memory on long sequences.")
    keep_checkpoints: int = _f(5, "Published checkpoints kept on disk (K); older dirs are deleted.")
    poll_interval_s: float = _f(5.0, "Seconds between store polls while waiting for a batch.")
    canary_prompts: list[str] = _f(DEFAULT_CANARIES, "Prompts the publish gate generates from.")
    canary_max_tokens: int = _f(
        96, "Greedy tokens generated per canary prompt by the gate (loops show after a few sentences)."
    )
    gate_max_kl: float = _f(
        0.5, "Gate: largest mean per-token KL(previous || new) on the canary continuations."
    )
    seed: int = _f(0, "Random seed (LoRA init, dropout).")
    threads: int | None = _f(
        None,
        "CPU threads for torch (None: torch's default, all cores). On a CPU shared with the engine, "
        "1 avoids thread oversubscription, which was 10x slower here than one thread.",
    )

    def __post_init__(self) -> None:
        if self.method not in ("rl", "opd", "combined"):
            raise ConfigError(f"trainer.method={self.method!r}: use 'rl', 'opd' or 'combined'.")
        if self.batch_size < 1:
            raise ConfigError("trainer.batch_size must be >= 1.")
        if self.micro_batch_size < 1:
            raise ConfigError("trainer.micro_batch_size must be >= 1.")
        if not 0 < self.refusal_backoff <= 1:
            raise ConfigError(f"trainer.refusal_backoff={self.refusal_backoff}: use a factor in (0, 1] (1: off).")
        if self.truncated not in ("negative", "skip"):
            raise ConfigError(f"trainer.truncated={self.truncated!r}: use 'negative' or 'skip'.")
        if self.teacher not in ("current", "base", "ema"):
            raise ConfigError(f"trainer.teacher={self.teacher!r}: use 'current', 'base' or 'ema'.")
        if self.finetune not in ("full", "lora"):
            raise ConfigError(f"trainer.finetune={self.finetune!r}: use 'full' or 'lora'.")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"trainer.dtype={self.dtype!r}: use float32, bfloat16 or float16.")
        if not (0 <= self.epsilon_low < 1) or self.epsilon_high < 0:
            raise ConfigError("trainer.epsilon_low must be in [0, 1) and epsilon_high >= 0 (0.2 / 0.28).")
        if self.max_staleness < 0:
            raise ConfigError("trainer.max_staleness must be >= 0.")
        if self.keep_checkpoints < 1:
            raise ConfigError("trainer.keep_checkpoints must be >= 1 (the current version stays on disk).")
        if not (0 < self.ema_rate <= 1):
            raise ConfigError("trainer.ema_rate must be in (0, 1].")
        if self.learning_rate <= 0:
            raise ConfigError("trainer.learning_rate must be > 0.")
        if self.threads is not None and self.threads < 1:
            raise ConfigError("trainer.threads must be >= 1 (or null for torch's default).")
        if self.loss_norm not in ("token", "sequence"):
            raise ConfigError(f"trainer.loss_norm={self.loss_norm!r}: use 'token' or 'sequence'.")
        if self.baseline_window < 0:
            raise ConfigError("trainer.baseline_window must be >= 0 (0 turns the baseline off).")
        if self.opd_clip <= 0:
            raise ConfigError("trainer.opd_clip must be > 0.")
