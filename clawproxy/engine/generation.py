"""What clawproxy's engine server (``engine/server.py``) drives, whichever engine is behind it.

A ``GenRequest`` and its ``StepEvent``s, the ``Serving`` protocol the embedded engine
(``engine/embedded/core.py``) and llama.cpp (``engine/llamacpp/engine.py``) both meet, the state they
hold alike (``ServingBase``), and ``advance``: the EOS, stop-string and length rules every sampled
token goes through.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    import torch

LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")


@dataclass
class SamplingParams:
    """What one request asks of the sampler (already validated by the server)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False  # vLLM's extra sampling param; benchmarks use it for fixed lengths
    # vLLM's penalties (vllm/model_executor/layers/utils.py apply_penalties): repetition over the
    # prompt and the output, frequency and presence over the output only
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    @property
    def penalized(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)


@dataclass
class StepEvent:
    """One decode step's output for one request, sent to its HTTP handler."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    text: str
    weight_version: int
    finish_reason: str | None = None  # stop | length | abort
    stop_reason: str | int | None = None
    error: str | None = None
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


@dataclass
class GenRequest:
    prompt_ids: list[int]
    params: SamplingParams
    emit: Callable[[StepEvent], object]  # its result is ignored
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    cancelled: bool = False
    adapter: str | None = None  # the LoRA adapter it names (an engine that serves them by name); None: the base
    # worker-side state
    completion_ids: list[int] = field(default_factory=list)
    sent_chars: int = 0
    generator: torch.Generator | None = None
    finished: bool = False
    kv_version: int = -1  # weight version that computed this request's first KV entries
    cache: Any = None  # own KV cache while prefilling (None before the first chunk)
    prefilled: int = 0  # prompt tokens in ``cache``
    cached_tokens: int = 0  # of those, taken from the prefix cache


class Serving(Protocol):
    """What the engine server (``engine/server.py``) drives: the embedded ``Engine``, ``LlamaCppEngine``
    over llama-server."""

    tokenizer: Any
    tokenizer_lock: threading.Lock
    # True: it also is a ``ServesAdapters`` (each LoRA adapter under its own name, beside the base);
    # False: ``load_lora`` merges the one adapter into the weights everyone gets
    adapters_by_name: bool

    @property
    def weight_version(self) -> int: ...
    @property
    def is_paused(self) -> bool: ...
    def load(self) -> dict[str, int | float]: ...
    def start(self) -> None: ...
    def stop(self, timeout: float = 10.0) -> None: ...
    def submit(self, req: GenRequest) -> None: ...
    def cancel(self, req: GenRequest) -> None: ...
    def pause(self, mode: str = "keep", timeout: float | None = None) -> None: ...
    def resume(self) -> None: ...
    def reload_full(self, path: str | Path, version: int | None = None) -> int: ...
    def load_lora(self, path: str | Path, version: int | None = None) -> int: ...
    def reset_prefix_cache(self) -> None: ...


class NamedAdapter(NamedTuple):
    """A LoRA adapter served under its name: the PEFT directory it was loaded from, its weight version."""

    path: str
    version: int


class ServesAdapters(Serving, Protocol):
    """An engine that serves LoRA adapters by name beside the base model, as vLLM does; a request
    picks one with its ``model`` (``GenRequest.adapter``)."""

    def adapters(self) -> dict[str, NamedAdapter]: ...
    def serving_version(self, adapter: str | None) -> int: ...
    def load_lora(self, path: str | Path, version: int | None = None, name: str = "clawproxy") -> int: ...
    def unload_lora(self, name: str) -> None: ...


class ServingBase:
    """What both engines hold alike: the tokenizer, the weight version that serves, the pause."""

    def __init__(self, tokenizer: Any, *, weight_version: int) -> None:
        # HF fast tokenizers are not safe to share across threads ("Already borrowed": every
        # __call__ resets truncation/padding through a mutable borrow). Request-side users
        # (the HTTP handlers) share ``tokenizer`` under ``tokenizer_lock``; the engine
        # detokenizes with its own copy.
        self.tokenizer = tokenizer
        self.tokenizer_lock = threading.Lock()
        self._detok = copy.deepcopy(tokenizer)
        self._version = weight_version
        self._cond = threading.Condition()
        self._pause_mode: str | None = None  # requested mode while pausing/paused

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def is_paused(self) -> bool:
        return self._pause_mode is not None


def advance(req: GenRequest, tok: int, lp: float, top: list[tuple[int, float]], *, detok: Any,
            eos_ids: set[int], max_model_len: int, version: int) -> StepEvent:
    """One sampled token's event: record it, detokenize, apply EOS, stop strings and length (the
    rules of every engine behind ``clawproxy/engine/server.py``)."""
    req.completion_ids.append(tok)
    finish: str | None = None
    stop_reason: str | int | None = None
    visible = req.completion_ids
    if tok in eos_ids and not req.params.ignore_eos:
        finish, stop_reason, visible = "stop", tok, req.completion_ids[:-1]
    text = detok.decode(visible, skip_special_tokens=True)
    cut = len(text)
    if req.params.stop:
        start = max(0, req.sent_chars - max(len(s) for s in req.params.stop))
        hits = [(text.find(s, start), s) for s in req.params.stop]
        hits = [(i, s) for i, s in hits if i >= 0]
        if hits:
            cut, stop_str = min(hits)
            finish, stop_reason = "stop", stop_str
    if finish is None:
        if len(req.completion_ids) >= req.params.max_tokens or (
            len(req.prompt_ids) + len(req.completion_ids) >= max_model_len
        ):
            finish = "length"
    if finish is None:
        # Hold back an incomplete UTF-8 sequence and anything that may start a stop string.
        if text.endswith("\ufffd"):
            cut = len(text.rstrip("\ufffd"))
        hold = max((_partial_len(text[:cut], s) for s in req.params.stop), default=0)
        cut -= hold
    cut = max(cut, req.sent_chars)
    delta = text[req.sent_chars : cut]
    req.sent_chars = cut
    if finish is not None:
        req.finished = True
    return StepEvent(token_ids=[tok], logprobs=[lp], top_logprobs=[top] if top else [], text=delta,
                     weight_version=version, finish_reason=finish, stop_reason=stop_reason,
                     cached_tokens=req.cached_tokens)


def _partial_len(text: str, stop: str) -> int:
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
