"""Judge configuration (one dataclass; see clawproxy.config for how it is loaded and validated)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from clawproxy.fields import STRICT, setting

Voter = Literal["embedding", "llm", "lexical"]
VOTERS = get_args(Voter)
HintSource = Literal["quote", "llm", "memory", "choose"]


@dataclass
class JudgeConfig:
    __pydantic_config__ = STRICT

    enabled: bool = setting(True, "Run the judge worker under `clawproxy start`.")
    votes: int = setting(3, "Votes per turn (m); majority wins, a tie gives 0.", ge=1)
    voter: Voter = setting(
        "embedding",
        "Voter: 'embedding' (CPU default: sentence embeddings + lexical cues), "
        "'llm' (any OpenAI-compatible endpoint) or 'lexical' (cue rules only).",
    )
    llm_url: str | None = setting(
        None,
        "Base URL of the LLM voter's OpenAI-compatible server (default: the engine, "
        "i.e. proxy.upstream or the embedded engine; never the proxy itself).",
    )
    llm_model: str | None = setting(
        None, "Model name for the LLM voter (default: the supervised engine's base model, never the "
        "adapter being trained; the first of /v1/models for any other server)."
    )
    min_confidence: float | None = setting(
        None,
        "Confidence a +1/-1 majority needs to count (the votes' mean probability of it); below it the "
        "turn scores 0 and is not trained. Default: the voter's own threshold, chosen on the labeled "
        "validation split (the embedding head's; 0 for llm and lexical). 0 never abstains.",
        ge=0.0, le=1.0,
    )
    hints: HintSource = setting(
        "quote",
        "OPD hints of -1 turns: 'quote' (the user's corrective words, or the LLM voter's own hint); "
        "'llm' (the LLM voter's endpoint and model rewrite the reaction as one instruction); 'memory' "
        "(this reply and the user's earlier complaints, quoted together); 'choose' (the instruction in "
        "judge/data/instructions.txt those replies make likeliest, scored by the LLM voter's endpoint). "
        "The voter still decides the score.",
    )
    memory_reactions: int = setting(
        3, "Replies a 'memory' or 'choose' hint reads: this one and the user's earlier complaints.", ge=1)
    temperature: float = setting(0.7, "Sampling temperature of the LLM voter.", ge=0.0, le=2.0)
    llm_max_tokens: int = setting(
        200, "Token budget of one LLM vote (at least 8: the answer needs a Score line).", ge=8
    )
    llm_timeout_s: float = setting(120.0, "Seconds before an LLM vote fails.", gt=0)
    poll_interval_s: float = setting(2.0, "Seconds between polls of the store.", gt=0)
    batch_size: int = setting(16, "Turns fetched from the store per poll by `judge run`.", ge=1)
