"""`clawproxy judge run|eval`."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def judge() -> None:
    """Score recorded turns from what happened next."""
