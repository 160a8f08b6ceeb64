"""`clawproxy openclaw-config`: print or write the OpenClaw provider block that fits the served model.

The block itself (profiles, token budgets, the merge into OpenClaw's config) is
``clawproxy/openclaw_setup.py``; this module only reads the served model and talks to the user.
Imports only light modules: this runs on every `clawproxy` invocation.
"""

from __future__ import annotations

from typing import Any

import click

from clawproxy.cli_options import CONTEXT_SETTINGS as CTX
from clawproxy.cli_options import build_config, config_options
from clawproxy.openclaw_setup import PROFILES


@click.command("openclaw-config", context_settings=CTX)
@click.option("--port", type=int, default=None, help="Proxy port (default: proxy.port).")
@click.option("--host", default=None, help="Host OpenClaw reaches the proxy on (default: proxy.host).")
@click.option("--model-id", default=None, help="Model id OpenClaw sends (default: the served model).")
@click.option("--api-key", default="sk-clawproxy", show_default=True,
              help="Sent as Authorization and forwarded to the upstream.")
@click.option("--upstream", default=None,
              help="Read the model from this server instead of the running proxy (the one "
                   "`clawproxy start --upstream` fronts).")
@click.option("--context-window", type=click.IntRange(min=1), default=None,
              help="The model's context length, for servers whose /v1/models does not report "
                   "max_model_len.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="OpenClaw's answer cap (default: 1/16 of the context, 256-8192).")
@click.option("--profile", type=click.Choice(list(PROFILES)), default=None,
              help="OpenClaw prompt profile (default: the richest that fits the context).")
@click.option("--temperature", type=click.FloatRange(0, 2), default=None,
              help="Sampling temperature OpenClaw sends (default: none, the server's default).")
@click.option("--no-learn", "no_learn", is_flag=True,
              help="Its conversations are recorded but never judged or trained on (the provider "
                   "sends x-clawproxy-learn: off).")
@click.option("--write", "write_to", is_flag=True,
              help="Merge the block into OpenClaw's config ($OPENCLAW_CONFIG_PATH or "
                   "~/.openclaw/openclaw.json), keeping a backup.")
@config_options
def openclaw_config(port: int | None, host: str | None, model_id: str | None, api_key: str,
                    upstream: str | None, context_window: int | None, max_tokens: int | None,
                    profile: str | None, temperature: float | None, no_learn: bool, write_to: bool,
                    config_path: str | None, data_dir: str | None) -> None:
    """Print (or --write) the OpenClaw provider block that fits the model behind this proxy.

    The context length and model id are read from the upstream's /v1/models, so run it while
    `clawproxy start` (or your own server) is up.
    """
    from clawproxy.openclaw_setup import (
        openclaw_config_path,
        plan,
        provider_block,
        render,
        write_config,
    )

    cfg = build_config(config_path, data_dir, **{"proxy.port": port, "proxy.upstream": upstream})
    h = host or cfg.proxy.host
    if h in ("0.0.0.0", "::", ""):
        h = "127.0.0.1"
    if ":" in h and not h.startswith("["):
        h = f"[{h}]"
    # the running proxy forwards /v1/models from whatever it fronts; --upstream reads that server
    server = upstream or f"http://{h}:{cfg.proxy.port}"
    card = {} if (model_id and context_window) else upstream_model_card(server, api_key)
    mid = model_id or str(card["id"])
    if context_window:
        ctx, source = context_window, "--context-window"
    elif isinstance(card.get("max_model_len"), int) and card["max_model_len"] > 0:
        ctx, source = card["max_model_len"], f"max_model_len of {server}"
    else:
        raise click.ClickException(
            f"{server.rstrip('/')}/v1/models does not report max_model_len; pass --context-window with "
            "the context length that server serves.")
    p = plan(ctx, max_tokens, profile, model=mid)
    sampling = {"temperature": temperature} if temperature is not None else None
    block = provider_block(f"http://{h}:{cfg.proxy.port}/v1", mid, api_key, p, sampling, learn=not no_learn)
    text = render(block, p, source)
    for w in p.warnings:
        click.secho(f"warning: {w}", err=True, fg="yellow")
    if not write_to:
        click.echo(text, nl=False)
        return
    from clawproxy.errors import ClawproxyError

    path = openclaw_config_path()
    try:
        backup = write_config(block, path)
    except ClawproxyError as e:
        raise click.ClickException(e.message) from e
    click.echo(text.split("\n{", 1)[0].replace("// merge into ~/.openclaw/openclaw.json (or run with "
                                                "--write)", f"// written to {path}"))
    if backup:
        click.echo(f"// previous config kept as {backup}")


def upstream_model_card(upstream: str, api_key: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """The first model card the upstream's ``/v1/models`` lists (id, max_model_len, ...)."""
    from clawproxy.engine.client import EngineClient
    from clawproxy.errors import EngineError

    try:
        return EngineClient(upstream, kind="vllm", token=api_key, timeout=timeout_s).served_model_card()
    except EngineError as e:
        raise click.ClickException(
            f"could not read the served model from {upstream.rstrip('/')}/v1/models ({e.message}); start "
            "clawproxy first (`make start`), or pass --model-id and --context-window."
        ) from e
