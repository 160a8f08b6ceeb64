"""``engine.kind: llamacpp``: clawproxy's engine server over llama.cpp's ``llama-server``.

On a laptop CPU llama.cpp decodes several times faster than vLLM's CPU build (bench/results/i51).
The trainer needs what was served exactly: the prompt's ids, every sampled id and its log-prob.
llama-server's chat route renders its own template and returns no prompt ids, so clawproxy's
engine server (``engine/server.py``) stays the front, as for the embedded engine: it renders the
chat template with the model's tokenizer, reads tool calls with the one reader and applies EOS,
stop strings and length (``generation.advance``). llama-server gets token ids on its native
``/completion`` route and streams back each sampled id with its log-prob (``n_probs``: before
sampling, from the raw logits, as vLLM's ``raw_logprobs``; ``processed_logprobs`` asks for them
after the sampler chain).

Adapters by name, as vLLM serves them (``EngineSpec.adapters_by_name``): each LoRA adapter is
loaded under a name, listed on ``/v1/models`` and picked by a request's ``model`` (the base's name:
no adapter; an unknown name: vLLM's 404). One llama-server holds them all (``--lora`` each) and
each ``/completion`` request sets every scale (``lora``: its adapter at 1, the others at 0), and
with it the weight version its events carry. llama-server decodes only requests with equal scales
in one batch (``can_batch_with``): requests for different adapters take turns, the lowest slot's
first, rather than share a batch.

Weights. llama-server reads adapter files only at start, so every load, unload or full reload is
served by a new llama-server with the whole new set: the PEFT adapter is written as a GGUF adapter
in this process (``gguf_lora``; llama.cpp's own script for other architectures and for a full
checkpoint), a second server starts beside the serving one, and new requests go to it once it
answers ``/health``. Requests already running finish on the old server, which then stops: no
request fails across a publish. Each adapter file is named after its adapter and version, so a new
conversion never rewrites a file a running server was started with.

Pause: llama-server cannot freeze a running request. ``keep`` and ``wait`` hold new requests and
let running ones finish on the weights they started with (``wait`` returns once they have);
``abort`` ends them.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import http.client
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawproxy.engine.generation import GenRequest, NamedAdapter, ServingBase, StepEvent, advance
from clawproxy.engine.llamacpp.build import LlamaCpp
from clawproxy.engine.llamacpp.gguf_lora import convertible, write_adapter
from clawproxy.errors import EngineError

log = logging.getLogger(__name__)

GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
READY_TIMEOUT_S = 300.0
PREFILL_BATCH = 512  # llama-server's -b: its default ubatch (-ub 512), so each step computes the same


def _die_with_parent() -> None:
    """Runs in the llama-server child before exec: SIGTERM when the engine process dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def convert_model(llama: LlamaCpp, model_dir: Path, out: Path, outtype: str) -> Path:
    """A Hugging Face checkpoint directory as one GGUF file (``convert_hf_to_gguf.py``), once."""
    if out.exists():
        return out
    tmp = _mkdir(out.parent) / (out.name + ".part")
    _run_script(llama, [str(llama.convert_model), str(model_dir), "--outtype", outtype, "--outfile", str(tmp)])
    tmp.rename(out)
    return out


def convert_adapter(llama: LlamaCpp, adapter_dir: Path, base_dir: Path, out: Path) -> Path:
    """A PEFT LoRA adapter as a GGUF adapter, float32 as the trainer's: in this process where
    ``gguf_lora`` knows the architecture, else by ``convert_lora_to_gguf.py``."""
    tmp = _mkdir(out.parent) / (out.name + ".part")
    t0 = time.perf_counter()
    if write_adapter(llama.root, adapter_dir, base_dir, tmp) is not None:
        tmp.rename(out)
        log.info("adapter %s written as GGUF in %.2fs", adapter_dir.name, time.perf_counter() - t0)
        return out
    log.info("adapter %s: converting with convert_lora_to_gguf.py (%s)", adapter_dir.name,
             convertible(adapter_dir, base_dir) or "tensors it does not rename")
    _run_script(llama, [str(llama.convert_lora), str(adapter_dir), "--base", str(base_dir),
                        "--outtype", "f32", "--outfile", str(tmp)])
    tmp.rename(out)
    return out


def _run_script(llama: LlamaCpp, args: list[str]) -> None:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=llama.script_env())
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise EngineError(f"{Path(args[0]).name} failed:\n{tail}", status=500)
    log.info("%s %s: %.1fs", Path(args[0]).name, Path(args[1]).name, time.perf_counter() - t0)


LISTENING = re.compile(rb"listening on http://[^\s:]+:(\d+)")
FILE_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter served by name: its PEFT directory (its ``root`` on ``/v1/models``), its
    weight version and the GGUF file llama-server reads."""

    name: str
    path: str
    version: int
    gguf: Path


class Instance:
    """One llama-server child: one model file at one weight version, and the adapters it serves by
    name. It binds a port of its own choosing (``--port 0``), read from its log: no port picked here
    can be taken by another process before the server binds it."""

    def __init__(self, argv: list[str], version: int, log_path: Path, adapters: tuple[Adapter, ...] = ()) -> None:
        self.port = 0
        self.version = version  # of the model file: what a request for the base model gets
        self.adapters = adapters  # in --lora order: a request's lora ids index it
        self.inflight = 0
        self.retired = False
        self.log_path = log_path
        self._log_from = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=_die_with_parent)

    def connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def version_of(self, adapter: str | None) -> int | None:
        """The weight version a request for ``adapter`` gets here (None: the base model's); None
        when it serves no adapter of that name."""
        if adapter is None:
            return self.version
        return next((a.version for a in self.adapters if a.name == adapter), None)

    def lora(self, adapter: str | None) -> list[dict[str, Any]]:
        """A ``/completion`` request's ``lora``: ``adapter`` at scale 1, every other one at 0. Never
        left out: a request without it gets each adapter at its ``--lora`` scale, 1."""
        return [{"id": i, "scale": 1.0 if a.name == adapter else 0.0} for i, a in enumerate(self.adapters)]

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until ``/health`` answers 200 (503 while the model loads); EngineError if it exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineError(f"llama-server exited with {self.proc.returncode} while starting:\n"
                                  f"{self.log_tail()}", status=500)
            if not self.port:
                self.port = self._listening_port()
                if not self.port:
                    time.sleep(0.05)
                    continue
            conn = self.connection(timeout=2)
            try:
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.05)
        self.stop()
        raise EngineError(f"llama-server did not answer /health within {timeout:g} s:\n{self.log_tail()}", status=504)

    def _listening_port(self) -> int:
        with open(self.log_path, "rb") as f:
            f.seek(self._log_from)
            found = LISTENING.search(f.read())
        return int(found.group(1)) if found else 0

    def log_tail(self, lines: int = 12) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class LlamaCppEngine(ServingBase):
    """``generation.ServesAdapters`` (what ``engine/server.py`` drives) over llama-server children."""

    adapters_by_name = True

    def __init__(self, llama: LlamaCpp, model_gguf: Path, model_dir: Path, tokenizer: Any, eos_ids: set[int], *,
                 work_dir: Path, max_batch_size: int = 8, max_model_len: int = 8192, threads: int | None = None,
                 logprobs_mode: str = "raw_logprobs", weight_version: int = 0) -> None:
        # _version: the last one loaded, of any adapter or the base (/weight_info)
        super().__init__(tokenizer, weight_version=weight_version)
        self.llama, self.model_gguf, self.model_dir = llama, model_gguf, model_dir
        self._detok_lock = threading.Lock()  # the request threads decode with _detok
        self.eos_ids = eos_ids
        self.work_dir = work_dir
        self.max_batch_size, self.max_model_len = max_batch_size, max_model_len
        self.threads = threads or max(1, len(os.sched_getaffinity(0)))
        self.post_sampling = logprobs_mode == "processed_logprobs"
        self._base_version = weight_version  # the model file's
        self._current: Instance | None = None
        self._instances: list[Instance] = []
        self._running: dict[str, tuple[GenRequest, Instance, http.client.HTTPConnection | None]] = {}
        self._waiting = 0
        self._publish_lock = threading.Lock()  # one new server at a time
        self.prefix_tokens_reused = 0

    # -- lifecycle ----------------------------------------------------------------------------

    def argv(self, adapters: tuple[Adapter, ...] = ()) -> list[str]:
        argv = [str(self.llama.server), "-m", str(self.model_gguf), "--host", "127.0.0.1", "--port", "0",
                "-c", str(self.max_model_len), "-np", str(self.max_batch_size), "--kv-unified",
                "-t", str(self.threads), "-tb", str(self.threads), "--no-webui",
                # a prompt is computed PREFILL_BATCH tokens per server step (its default 2048 made a
                # 1.8k prompt one step): a cancelled request (the proxy's warm-up giving way) ends, and
                # a decoding request gets a token, within one ubatch's time; the ubatch is 512 either way
                "-b", str(PREFILL_BATCH)]
        if not adapters:
            return argv
        # --cache-ram 0: the RAM prompt cache keys prompts by their tokens alone, and would hand a
        # prompt's KV computed under one adapter to a request for another (a slot's own KV is dropped
        # when its next request's scales differ)
        return argv + [arg for a in adapters for arg in ("--lora", str(a.gguf))] + [
            "--lora-init-without-apply", "--cache-ram", "0"]

    def _spawn(self, adapters: tuple[Adapter, ...], version: int) -> Instance:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        inst = Instance(self.argv(adapters), version, self.work_dir / "llama-server.log", adapters)
        with self._cond:
            self._instances.append(inst)
        try:
            inst.wait_ready()
        except EngineError:
            with self._cond:
                self._instances.remove(inst)
            inst.stop()
            raise
        return inst

    def start(self) -> None:
        self._switch(self._spawn((), self._base_version))

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            instances, self._instances, self._current = list(self._instances), [], None
            for req, _, conn in list(self._running.values()):
                self._abort(req, conn)  # the handler ends its answer with finish_reason "abort"
            self._cond.notify_all()
        for inst in instances:
            inst.stop()

    def load(self) -> dict[str, int | float]:
        return {"running": len(self._running), "waiting": self._waiting, "servers": len(self._instances),
                "adapters": len(self._served()), "prefix_tokens_reused": self.prefix_tokens_reused}

    def adapters(self) -> dict[str, NamedAdapter]:
        """The adapters a new request may name: name -> its PEFT directory and weight version."""
        return {name: NamedAdapter(a.path, a.version) for name, a in self._served().items()}

    def serving_version(self, adapter: str | None) -> int:
        """The weight version a new request for ``adapter`` gets (None: the base model)."""
        inst = self._current
        version = inst.version_of(adapter) if inst is not None else None
        return self._base_version if version is None else version

    def _served(self) -> dict[str, Adapter]:
        inst = self._current
        return {a.name: a for a in inst.adapters} if inst is not None else {}

    # -- weights ------------------------------------------------------------------------------

    def _switch(self, inst: Instance) -> None:
        """New requests go to ``inst``; the old server stops once its running requests are done."""
        with self._cond:
            old, self._current = self._current, inst
            if old is not None:
                old.retired = True
            self._cond.notify_all()
        if old is not None:
            self._retire(old)

    def _retire(self, inst: Instance) -> None:
        with self._cond:
            if not inst.retired or inst.inflight > 0 or inst not in self._instances:
                return
            self._instances.remove(inst)
        inst.stop()

    def load_lora(self, path: str | Path, version: int | None = None, name: str = "clawproxy") -> int:
        """Serve the PEFT adapter at ``path`` under ``name`` (in place of an adapter of that name),
        beside the others, from a new llama-server; switch to it once ready."""
        path = Path(path)
        if not (path / "adapter_config.json").is_file():
            raise EngineError(f"Loading lora {name} failed: No adapter found for {path}", status=404)
        with self._publish_lock:
            new = self._version + 1 if version is None else int(version)
            t0 = time.perf_counter()
            self._sweep()
            served = self._served()
            gguf = self.work_dir / "adapters" / f"{_file_stem(name)}-v{new}.gguf"
            same = served.get(name) == Adapter(name, str(path), new, gguf)
            if not (same and gguf.exists()):  # the proxy loading again what serves already: nothing new
                convert_adapter(self.llama, path, self.model_dir, gguf)
            served[name] = Adapter(name, str(path), new, gguf)
            self._switch(self._spawn(tuple(served.values()), self._base_version))
            self._version = new
            log.info("serving LoRA %s as %r, weight version %d, after %.2fs", path, name, new,
                     time.perf_counter() - t0)
            return new

    def unload_lora(self, name: str) -> None:
        """Serve every adapter but ``name`` from a new llama-server; EngineError 404 if none has it."""
        with self._publish_lock:
            served = self._served()
            if served.pop(name, None) is None:
                raise EngineError(f"The lora adapter '{name}' cannot be found.", status=404)
            self._sweep()
            self._switch(self._spawn(tuple(served.values()), self._base_version))
            log.info("unloaded LoRA %r", name)

    def reload_full(self, path: str | Path, version: int | None = None) -> int:
        """Serve the full checkpoint at ``path`` (converted to GGUF), with the adapters loaded, from
        a new llama-server."""
        with self._publish_lock:
            new = self._version + 1 if version is None else int(version)
            outtype = GGUF_TYPES.get(_checkpoint_dtype(Path(path)), "f32")
            gguf = convert_model(self.llama, Path(path), self.work_dir / "full" / f"v{new}.gguf", outtype)
            old_gguf, self.model_gguf = self.model_gguf, gguf
            try:
                self._switch(self._spawn(tuple(self._served().values()), new))
            except EngineError:
                self.model_gguf = old_gguf
                raise
            self._version = self._base_version = new
            return new

    def _sweep(self) -> None:
        """Delete the adapter files no llama-server reads any more (those a retired one read)."""
        with self._cond:
            used = {a.gguf for inst in self._instances for a in inst.adapters}
        for f in (self.work_dir / "adapters").glob("*.gguf"):
            if f not in used:
                f.unlink(missing_ok=True)

    def reset_prefix_cache(self) -> None:
        """Nothing to drop: a new version is a new server, whose cache starts empty."""

    # -- pause --------------------------------------------------------------------------------

    def pause(self, mode: str = "keep", timeout: float | None = None) -> None:
        if mode not in ("keep", "wait", "abort"):
            raise EngineError(f"pause mode {mode!r}: use keep, wait or abort", status=400)
        with self._cond:
            self._pause_mode = mode
            if mode == "abort":
                for req, _, conn in list(self._running.values()):
                    self._abort(req, conn)
            self._cond.notify_all()
            if mode == "wait" and not self._cond.wait_for(lambda: not self._running or self._pause_mode is None,
                                                          timeout):
                raise EngineError("the engine did not pause in time", status=504)

    def resume(self) -> None:
        with self._cond:
            self._pause_mode = None
            self._cond.notify_all()

    # -- requests -----------------------------------------------------------------------------

    def submit(self, req: GenRequest) -> None:
        threading.Thread(target=self._serve, args=(req,), name=f"llamacpp-{req.id[:8]}", daemon=True).start()

    def cancel(self, req: GenRequest) -> None:
        req.cancelled = True
        with self._cond:
            entry = self._running.get(req.id)
            if entry is not None and entry[2] is not None:
                _hang_up(entry[2])  # llama-server ends a request whose client went away
            self._cond.notify_all()

    def _abort(self, req: GenRequest, conn: http.client.HTTPConnection | None) -> None:
        if not req.finished:
            req.finished = True
            req.emit(StepEvent([], [], [], "", req.kv_version, finish_reason="abort"))
        if conn is not None:
            _hang_up(conn)

    def _serve(self, req: GenRequest) -> None:
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: req.cancelled or (self._pause_mode is None and self._current is not None))
            self._waiting -= 1
            if req.cancelled:
                return
            inst = self._current
            assert inst is not None
            version = inst.version_of(req.adapter)
            if version is not None:
                req.kv_version = version  # every event of the request carries it
                inst.inflight += 1
                self._running[req.id] = (req, inst, None)
        if version is None:  # unloaded after the server checked the name
            req.finished = True
            ev = StepEvent([], [], [], "", inst.version, finish_reason="abort")
            ev.error = f"The model `{req.adapter}` does not exist."
            req.emit(ev)
            return
        try:
            self._generate(req, inst)
        except (OSError, http.client.HTTPException, ValueError) as err:
            if not req.finished and not req.cancelled:
                req.finished = True
                ev = StepEvent([], [], [], "", version, finish_reason="abort")
                ev.error = f"llama-server: {err}"
                req.emit(ev)
        finally:
            with self._cond:
                self._running.pop(req.id, None)
                inst.inflight -= 1
                self._cond.notify_all()
            self._retire(inst)

    def body(self, req: GenRequest, inst: Instance) -> dict[str, Any]:
        """The ``/completion`` request: the prompt's ids, the adapter scales, clawproxy's sampling,
        llama.cpp's extra samplers off, and the log-prob of each sampled token (``n_probs`` >= 1)."""
        p = req.params
        room = self.max_model_len - len(req.prompt_ids)
        lora = {"lora": inst.lora(req.adapter)} if inst.adapters else {}
        return {
            **lora,
            "prompt": req.prompt_ids, "n_predict": max(1, min(p.max_tokens, room)), "stream": True,
            "return_tokens": True, "cache_prompt": True,
            "timings_per_token": True,  # the first token's timings say how much of the prompt was cached
            "n_probs": max(1, p.top_logprobs), "post_sampling_probs": self.post_sampling,
            "temperature": p.temperature, "top_p": p.top_p, "top_k": 0, "min_p": 0.0, "typical_p": 1.0,
            "xtc_probability": 0.0, "dry_multiplier": 0.0, "top_n_sigma": -1.0,
            "repeat_penalty": p.repetition_penalty, "repeat_last_n": self.max_model_len,
            "frequency_penalty": p.frequency_penalty, "presence_penalty": p.presence_penalty,
            "seed": p.seed if p.seed is not None else -1, "ignore_eos": p.ignore_eos,
        }

    def _generate(self, req: GenRequest, inst: Instance) -> None:
        conn = inst.connection()
        with self._cond:
            if req.id in self._running:
                self._running[req.id] = (req, inst, conn)
        try:
            conn.request("POST", "/completion", json.dumps(self.body(req, inst)),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}: {resp.read()[:300].decode(errors='replace')}")
            for event in _sse(resp):
                if req.cancelled or req.finished:
                    return
                if "error" in event:
                    raise ValueError(str(event["error"]))
                self._events(req, event)
                if req.finished:  # a stop string or the length: hang up, llama-server stops there
                    return
                if event.get("stop"):
                    # llama-server stopped first (an end-of-generation token clawproxy does not count as EOS)
                    req.finished = True
                    req.emit(StepEvent([], [], [], "", req.kv_version, finish_reason="stop"))
            if not (req.finished or req.cancelled):
                raise ValueError("the stream ended before the answer did (did llama-server exit?)")
        finally:
            conn.close()

    def _events(self, req: GenRequest, event: dict[str, Any]) -> None:
        timings = event.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("cache_n"), int) and not req.completion_ids:
            req.cached_tokens = timings["cache_n"]
            self.prefix_tokens_reused += req.cached_tokens
        for entry in event.get("completion_probabilities") or ():
            if req.finished:
                return
            top = [(int(t["id"]), _logprob(t)) for t in entry.get("top_probs" if self.post_sampling else "top_logprobs",
                                                               ())][: req.params.top_logprobs]
            with self._detok_lock:
                ev = advance(req, int(entry["id"]), _logprob(entry), top, detok=self._detok, eos_ids=self.eos_ids,
                             max_model_len=self.max_model_len, version=req.kv_version)
            req.emit(ev)


def _file_stem(name: str) -> str:
    """An adapter name as a file name: itself when it is one, else a digest of it."""
    return name if FILE_NAME.fullmatch(name) and not name.startswith(".") else hashlib.sha256(name.encode()).hexdigest()[:16]


def _hang_up(conn: http.client.HTTPConnection) -> None:
    """End a connection another thread may be reading: shutdown wakes its blocked read at once."""
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def _sse(resp: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    """The ``data:`` events of a server-sent event stream, decoded."""
    for raw in resp:
        line = raw.strip()
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data and data != b"[DONE]":
                yield json.loads(data)
        elif line.startswith(b"error:"):
            yield {"error": line[6:].strip().decode(errors="replace")}


def _logprob(entry: dict[str, Any]) -> float:
    """An entry's log-prob: given as such before sampling, as a probability after it."""
    if "logprob" in entry:
        return float(entry["logprob"])
    p = float(entry["prob"])
    return math.log(p) if p > 0 else float("-inf")


def _checkpoint_dtype(path: Path) -> str:
    try:
        return str(json.loads((path / "config.json").read_text()).get("torch_dtype") or "float32")
    except (OSError, ValueError):
        return "float32"


def build_engine(e: Any, data_dir: str) -> tuple[LlamaCppEngine, Path, int]:
    """The engine ``python -m clawproxy.engine`` serves for ``engine.kind: llamacpp`` (not started),
    its Hugging Face model directory (the trainer's weights) and the context length it serves."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from clawproxy.catalog import fetch_gguf, lookup
    from clawproxy.engine.llamacpp.build import require
    from clawproxy.engine.model import context_limit, eos_token_ids, resolve_model, serving_length

    llama = require()
    root = resolve_model(e.model, data_dir)
    if not Path(str(root)).is_dir():  # a Hugging Face id: llama.cpp converts from files
        from huggingface_hub import snapshot_download

        root = snapshot_download(str(root))
    root = Path(str(root))
    work = Path(data_dir) / "llamacpp"
    if e.quantization == "q4_k_m":
        named = lookup(e.model)
        if named is None or not named.gguf_file.lower().endswith("q4_k_m.gguf"):
            raise EngineError(f"engine.quantization=q4_k_m serves a catalog model's own Q4_K_M file; "
                              f"{e.model!r} has none (`clawproxy models list`)", status=400)
        gguf = fetch_gguf(named)
    else:
        outtype = GGUF_TYPES[e.dtype]
        gguf = convert_model(llama, root, work / "models" / f"{root.name}-{outtype}.gguf", outtype)
    tokenizer = AutoTokenizer.from_pretrained(str(root))
    from types import SimpleNamespace

    gen = GenerationConfig.from_pretrained(str(root)) if (root / "generation_config.json").exists() else None
    eos = eos_token_ids(SimpleNamespace(generation_config=gen), tokenizer)
    max_len = serving_length(e.max_model_len, context_limit(AutoConfig.from_pretrained(str(root))), e.rope_scaling)
    engine = LlamaCppEngine(llama, gguf, root, tokenizer, eos, work_dir=work, max_batch_size=e.max_batch_size,
                            max_model_len=max_len, threads=e.threads, logprobs_mode=e.logprobs_mode)
    return engine, root, max_len


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
