"""The `clawproxy` command line: nouns for groups, verbs for commands (`clawproxy sessions list`).

Heavy parts (torch, the engine, the trainer) are imported inside the commands that need them.
"""

from __future__ import annotations

from typing import Any

import click

from clawproxy.config import Config, load_config
from clawproxy.errors import ClawproxyError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


def build_config(config_path: str | None, **overrides: Any) -> Config:
    """Config file + CLI overrides (dotted keys), with errors turned into one-line CLI messages."""
    try:
        return load_config(config_path, overrides)
    except ClawproxyError as e:
        raise click.ClickException(e.message) from e


def config_options(f):
    f = click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                     help="YAML config file (default: configs/default.yaml).")(f)
    f = click.option("--data-dir", default=None, help="Data directory (default ./clawproxy-data).")(f)
    return f


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(package_name="clawproxy")
def main() -> None:
    """clawproxy: personalize a self-hosted LLM just by talking to it."""


@main.command(context_settings=CONTEXT_SETTINGS)
@config_options
@click.option("--upstream", default=None, help="Existing OpenAI-compatible server (no embedded engine).")
@click.option("--host", default=None, help="Proxy bind address (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Proxy port (default 8080).")
@click.option("--model", default=None, help="Model for the embedded engine: HF id, local dir or .gguf.")
@click.option("--engine-port", type=int, default=None, help="Embedded engine port (default 8081).")
@click.option("--no-judge", is_flag=True, help="Do not run the judge worker.")
@click.option("--no-train", is_flag=True, help="Do not run the trainer.")
def start(config_path, data_dir, upstream, host, port, model, engine_port, no_judge, no_train) -> None:
    """Run the proxy (and, without --upstream, the embedded engine), the judge and the trainer."""
    cfg = build_config(
        config_path,
        data_dir=data_dir,
        **{
            "proxy.upstream": upstream,
            "proxy.host": host,
            "proxy.port": port,
            "engine.model": model,
            "engine.port": engine_port,
            "judge.enabled": False if no_judge else None,
            "trainer.enabled": False if no_train else None,
        },
    )
    from clawproxy.supervisor import run

    try:
        run(cfg)
    except ClawproxyError as e:
        raise click.ClickException(e.message) from e


def _register() -> None:
    """Attach the command groups that live beside their components."""
    from clawproxy.sessions_cli import openclaw_config, sessions
    from clawproxy.simulate.cli import simulate
    from judge.cli import judge
    from trainer.cli import rollback, stats, train

    for cmd in (sessions, openclaw_config, judge, train, rollback, stats, simulate):
        main.add_command(cmd)


_register()


if __name__ == "__main__":
    main()
