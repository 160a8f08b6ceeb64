"""`clawproxy sessions list|show|export|delete` and `clawproxy openclaw-config`."""

from __future__ import annotations

import click


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def sessions(ctx: click.Context) -> None:
    """Inspect what was collected (alone: list sessions)."""
    if ctx.invoked_subcommand is None:
        click.echo("not implemented yet")


@click.command("openclaw-config", context_settings={"help_option_names": ["-h", "--help"]})
def openclaw_config() -> None:
    """Print the openclaw.json provider block that points OpenClaw at this proxy."""
    click.echo("not implemented yet")
