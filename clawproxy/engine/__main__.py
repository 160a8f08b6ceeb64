"""``python -m clawproxy.engine``: run the engine that ``clawproxy start`` spawns.

With ``engine.kind: vllm`` this resolves the model and becomes vLLM's OpenAI server
(``clawproxy/engine/vllm/launch.py``); with ``embedded`` it serves the built-in transformers engine, and
with ``llamacpp`` the same server over llama.cpp's llama-server (``clawproxy/engine/llamacpp/engine.py``).

    python -m clawproxy.engine --config <data_dir>/run-config.yaml       # as `clawproxy start` does
    python -m clawproxy.engine --model default --port 8081                # alone

Settings come from the config's ``engine`` section (``EngineConfig``); each of its fields is also a
flag (``--max-batch-size 4``) that overrides the file, validated like the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from clawproxy.config import Config, EngineConfig, load_config
from clawproxy.errors import ClawproxyError

if TYPE_CHECKING:
    from clawproxy.engine.generation import Serving

# a list is no single flag: vllm_args comes from the config file
FLAGS = [f for f in dataclasses.fields(EngineConfig) if f.name != "vllm_args"]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m clawproxy.engine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None,
                   help="YAML config (default: configs/default.yaml); `clawproxy start` passes its run-config.yaml")
    p.add_argument("--data-dir", default=None, help="where converted models are cached (overrides data_dir)")
    for f in FLAGS:
        p.add_argument(_flag(f.name), dest=f.name, default=None, help=f.metadata["description"])
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> Config:
    """The config file's settings with the given flags on top (strings: the config edge parses them)."""
    overrides = {f"engine.{f.name}": getattr(args, f.name) for f in FLAGS}
    return load_config(args.config, {"data_dir": args.data_dir, **overrides})


def _embedded_engine(e: EngineConfig, data: str) -> tuple[Serving, Path | str, int]:
    from clawproxy.engine.embedded.core import Engine
    from clawproxy.engine.model import (
        context_limit,
        load_model_and_tokenizer,
        resolve_model,
        serving_length,
    )

    root = resolve_model(e.model, data)
    model, tokenizer = load_model_and_tokenizer(str(root), data, e.dtype, e.device, rope_scaling=e.rope_scaling)
    max_len = serving_length(e.max_model_len, context_limit(model.config), e.rope_scaling)
    engine = Engine(model, tokenizer, max_batch_size=e.max_batch_size, max_model_len=max_len,
                    logprobs_mode=e.logprobs_mode, threads=e.threads,
                    base_path=root if Path(str(root)).is_dir() else None,
                    prefix_cache_mb=e.prefix_cache_mb,
                    prefill_chunk_tokens=e.prefill_chunk_tokens)
    return engine, root, max_len


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("clawproxy.engine")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        cfg = config_from_args(args)
        e, data = cfg.engine, str(cfg.data_path)
        if e.kind == "vllm":
            from clawproxy.engine.vllm.launch import exec_server

            exec_server(e, cfg.trainer, data)  # never returns
        from aiohttp import web

        from clawproxy.engine.model import sampling_defaults
        from clawproxy.engine.server import ServerSettings, create_app

        engine: Serving
        root: Path | str
        if e.kind == "llamacpp":
            from clawproxy.engine.llamacpp.engine import build_engine

            engine, root, max_len = build_engine(e, data)
        else:
            engine, root, max_len = _embedded_engine(e, data)
        name = e.served_name
        settings = ServerSettings(
            served_model_name=name,
            model_root=str(root),
            max_model_len=max_len,
            default_max_tokens=e.default_max_tokens or None,
            control_token=e.control_token,
            sampling_defaults=sampling_defaults(root if Path(str(root)).is_dir() else None),
        )
    except ClawproxyError as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 2
    if not e.control_token and e.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("bound to %s without engine.control_token: control verbs answer loopback clients only",
                    e.host)
    app = create_app(engine, settings)

    def announce(message: str) -> None:
        # aiohttp's message names the real port (useful with --port 0).
        log.info("engine serving %s, weight version %d: %s", name, engine.weight_version,
                 message.strip().strip("=").strip())

    # shutdown_timeout: on SIGTERM the on_shutdown hook has already ended generations (finish_reason
    # "abort", then [DONE]); do not wait aiohttp's default minute for idle connections.
    web.run_app(app, host=e.host, port=e.port, print=announce, access_log=None,
                handle_signals=True, shutdown_timeout=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
