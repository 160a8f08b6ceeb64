"""``python -m clawproxy.engine``: run the embedded engine (what ``clawproxy start`` spawns).

    python -m clawproxy.engine --model default --host 127.0.0.1 --port 8081 --data-dir ./clawproxy-data

Defaults come from ``EngineConfig`` so the flags and the YAML config agree.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from clawproxy.config import EngineConfig, parse_rope_scaling
from clawproxy.errors import ClawproxyError, ConfigError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = EngineConfig()
    p = argparse.ArgumentParser(prog="python -m clawproxy.engine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=d.model, help="'default', a HF id, a local dir or a .gguf file")
    p.add_argument("--host", default=d.host, help="bind address (loopback by default)")
    p.add_argument("--port", type=int, default=d.port, help="port (0: pick a free one and print it)")
    p.add_argument("--data-dir", default="./clawproxy-data", help="where converted models are cached")
    p.add_argument("--dtype", default=d.dtype, choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default=d.device)
    p.add_argument("--control-token",
                   default=os.environ.get("CLAWPROXY_ENGINE_CONTROL_TOKEN") or d.control_token,
                   help="bearer token required for control verbs (needed off loopback); "
                        "default: $CLAWPROXY_ENGINE_CONTROL_TOKEN, which `clawproxy start` sets")
    p.add_argument("--served-model-name", default=d.served_model_name)
    p.add_argument("--max-model-len", type=int, default=d.max_model_len,
                   help="context limit (default: what the model supports, with --rope-scaling)")
    p.add_argument("--rope-scaling", default=None,
                   help='JSON, as vLLM: {"rope_type": "linear"|"yarn", "factor": 2}')
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size)
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens,
                   help="max_tokens when a request gives none (0: fill the context like vLLM)")
    p.add_argument("--logprobs-mode", default="raw_logprobs",
                   choices=["raw_logprobs", "processed_logprobs"],
                   help="raw: log_softmax of raw logits (vLLM's default); processed: after "
                        "temperature and top_p")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: half the CPUs, see core.default_threads)")
    p.add_argument("--prefix-cache-mb", type=float, default=d.prefix_cache_mb,
                   help="memory for the KV of recent prompts, reused by prompts that start alike (0: off)")
    p.add_argument("--prefill-chunk-tokens", type=int, default=d.prefill_chunk_tokens,
                   help="prompt tokens prefilled per step between decode steps (0: whole prompts)")
    p.add_argument("--weight-version", type=int, default=0, help="version of the weights at start")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def serving_length(asked: int | None, limit: int | None, rope: dict | None) -> int:
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("clawproxy.engine")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from aiohttp import web

        from clawproxy.engine.core import Engine
        from clawproxy.engine.model import (
            DEFAULT_MODEL_NAME,
            context_limit,
            load_model_and_tokenizer,
            resolve_model,
        )
        from clawproxy.engine.server import ServerSettings, create_app

        rope = parse_rope_scaling(args.rope_scaling)  # before the model loads: a typo fails fast
        root = resolve_model(args.model, args.data_dir)
        model, tokenizer = load_model_and_tokenizer(str(root), args.data_dir, args.dtype, args.device,
                                                    rope_scaling=rope)
        max_len = serving_length(args.max_model_len, context_limit(model.config), rope)
        engine = Engine(model, tokenizer, max_batch_size=args.max_batch_size, max_model_len=max_len,
                        logprobs_mode=args.logprobs_mode, threads=args.threads,
                        weight_version=args.weight_version,
                        base_path=root if Path(str(root)).is_dir() else None,
                        prefix_cache_mb=args.prefix_cache_mb,
                        prefill_chunk_tokens=args.prefill_chunk_tokens)
        name = args.served_model_name or (
            DEFAULT_MODEL_NAME if args.model in ("default", "") else Path(str(args.model)).name
        )
        settings = ServerSettings(
            served_model_name=name,
            model_root=str(root),
            max_model_len=max_len,
            default_max_tokens=args.default_max_tokens or None,
            control_token=args.control_token,
        )
    except ClawproxyError as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 2
    if not args.control_token and args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("bound to %s without --control-token: control verbs answer loopback clients only",
                    args.host)
    app = create_app(engine, settings)

    def announce(message: str) -> None:
        # aiohttp's message names the real port (useful with --port 0).
        log.info("engine serving %s, weight version %d: %s", name, engine.weight_version,
                 message.strip().strip("=").strip())

    # shutdown_timeout: on SIGTERM the on_shutdown hook has already ended generations (finish_reason
    # "abort", then [DONE]); do not wait aiohttp's default minute for idle connections.
    web.run_app(app, host=args.host, port=args.port, print=announce, access_log=None,
                handle_signals=True, shutdown_timeout=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
