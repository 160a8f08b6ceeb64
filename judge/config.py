"""Judge configuration (one dataclass; see clawproxy.config for how it is loaded)."""

from __future__ import annotations

from dataclasses import dataclass, field

from clawproxy.errors import ConfigError


@dataclass
class JudgeConfig:
    enabled: bool = field(default=True, metadata={"help": "Run the judge worker under `clawproxy start`."})
    votes: int = field(default=3, metadata={"help": "Votes per turn (m); majority wins, a tie gives 0."})
    voter: str = field(
        default="embedding",
        metadata={"help": "Voter: 'embedding' (CPU default) or 'llm' (any OpenAI-compatible endpoint)."},
    )
    llm_url: str | None = field(
        default=None, metadata={"help": "Base URL for the LLM voter (default: the engine)."}
    )
    llm_model: str | None = field(default=None, metadata={"help": "Model name for the LLM voter."})
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature of the LLM voter."})
    poll_interval_s: float = field(default=2.0, metadata={"help": "Seconds between polls of the store."})

    def __post_init__(self) -> None:
        if self.votes < 1:
            raise ConfigError("judge.votes must be >= 1 (3 is the default).")
        if self.voter not in ("embedding", "llm"):
            raise ConfigError(f"judge.voter={self.voter!r}: use 'embedding' or 'llm'.")
