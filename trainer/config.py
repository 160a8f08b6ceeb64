"""Trainer configuration (one dataclass; see clawproxy.config for how it is loaded)."""

from __future__ import annotations

from dataclasses import dataclass, field

from clawproxy.errors import ConfigError


@dataclass
class TrainerConfig:
    enabled: bool = field(default=True, metadata={"help": "Run the trainer under `clawproxy start`."})
    method: str = field(
        default="combined", metadata={"help": "'rl' (binary RL), 'opd' (distillation) or 'combined'."}
    )
    batch_size: int = field(default=4, metadata={"help": "Useful samples per optimizer step."})
    learning_rate: float = field(default=1e-5, metadata={"help": "AdamW learning rate."})
    max_staleness: int = field(
        default=4, metadata={"help": "Drop samples generated more than this many weight versions ago."}
    )
    keep_checkpoints: int = field(default=5, metadata={"help": "Published checkpoints kept on disk (K)."})

    def __post_init__(self) -> None:
        if self.method not in ("rl", "opd", "combined"):
            raise ConfigError(f"trainer.method={self.method!r}: use 'rl', 'opd' or 'combined'.")
        if self.batch_size < 1:
            raise ConfigError("trainer.batch_size must be >= 1.")
