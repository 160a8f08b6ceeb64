"""`clawproxy train`, `clawproxy rollback`, `clawproxy stats`."""

from __future__ import annotations

import click


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
def train() -> None:
    """Train on judged turns and publish new weights to the engine."""
    raise click.ClickException("not implemented yet")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
def rollback() -> None:
    """Reload an earlier checkpoint into the engine."""
    raise click.ClickException("not implemented yet")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
def stats() -> None:
    """Learning progress per weight version."""
    raise click.ClickException("not implemented yet")
