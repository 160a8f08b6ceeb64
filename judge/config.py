"""Judge configuration (one dataclass; see clawproxy.config for how it is loaded)."""

from __future__ import annotations

from dataclasses import dataclass, field

from clawproxy.errors import ConfigError

VOTERS = ("embedding", "llm", "lexical")


@dataclass
class JudgeConfig:
    enabled: bool = field(default=True, metadata={"help": "Run the judge worker under `clawproxy start`."})
    votes: int = field(default=3, metadata={"help": "Votes per turn (m); majority wins, a tie gives 0."})
    voter: str = field(
        default="embedding",
        metadata={"help": "Voter: 'embedding' (CPU default: sentence embeddings + lexical cues), "
                          "'llm' (any OpenAI-compatible endpoint) or 'lexical' (cue rules only)."},
    )
    llm_url: str | None = field(
        default=None,
        metadata={"help": "Base URL of the LLM voter's OpenAI-compatible server (default: the engine, "
                          "i.e. proxy.upstream or the embedded engine; never the proxy itself)."},
    )
    llm_model: str | None = field(
        default=None, metadata={"help": "Model name for the LLM voter (default: the first of /v1/models)."}
    )
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature of the LLM voter."})
    llm_max_tokens: int = field(default=200, metadata={"help": "Token budget of one LLM vote."})
    llm_timeout_s: float = field(default=120.0, metadata={"help": "Seconds before an LLM vote fails."})
    poll_interval_s: float = field(default=2.0, metadata={"help": "Seconds between polls of the store."})
    batch_size: int = field(
        default=16, metadata={"help": "Turns fetched from the store per poll by `judge run`."}
    )

    def __post_init__(self) -> None:
        if self.votes < 1:
            raise ConfigError("judge.votes must be >= 1 (3 is the default).")
        if self.voter not in VOTERS:
            raise ConfigError(f"judge.voter={self.voter!r}: use one of {', '.join(VOTERS)}.")
        if not 0.0 <= self.temperature <= 2.0:
            raise ConfigError(f"judge.temperature={self.temperature}: use a value in [0, 2].")
        if self.llm_max_tokens < 8:
            raise ConfigError("judge.llm_max_tokens must be >= 8 (the answer needs a Score line).")
        if self.llm_timeout_s <= 0 or self.poll_interval_s <= 0:
            raise ConfigError("judge.llm_timeout_s and judge.poll_interval_s must be > 0 seconds.")
        if self.batch_size < 1:
            raise ConfigError("judge.batch_size must be >= 1.")
