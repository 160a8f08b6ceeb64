"""GGUF files to Hugging Face directories, and directories written atomically.

The one piece the catalog (named models) and the engine's model resolution both need; it imports
neither of them, so the dependency runs one way: ``catalog`` and ``engine.model`` -> here.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clawproxy.errors import ConfigError

log = logging.getLogger(__name__)

SOURCE_FILE = "clawproxy_source.json"  # in a converted directory: which verified bytes it came from


def convert_gguf(gguf_path: Path, out_dir: Path, *, eos_tokens: tuple[str, ...] = (),
                 source: dict[str, Any] | None = None) -> Path:
    """Dequantize a GGUF file into a float32 safetensors checkpoint at ``out_dir`` (atomically).

    ``eos_tokens``: the tokens that end an answer, written as the generation config's
    ``eos_token_id`` (vLLM and ``generate`` stop on it; the GGUF names only one). ``source``: written
    as ``SOURCE_FILE``, so a finished conversion can be told from a stale one.
    """
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
            (tmp / SOURCE_FILE).write_text(json.dumps(source, indent=1) + "\n")

    return write_dir_atomically(out_dir, save)


def gguf_chat_template(gguf_path: Path) -> str | None:
    """The ``tokenizer.chat_template`` a GGUF file carries in its metadata (None when it has none)."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.chat_template")
    return bytes(field.parts[field.data[0]]).decode() if field is not None else None


def write_dir_atomically(out_dir: Path, save: Callable[[Path], None]) -> Path:
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
