"""What every `clawproxy` command shares: ``-h``, the ``--config/--data-dir`` pair, the config they
load, and a progress bar (rich). Commands raise ``ClawproxyError`` as it comes; the root group in
``clawproxy.cli`` turns it into a one-line CLI message.

Light imports only: every `clawproxy` invocation loads this module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

from clawproxy.config import Config, load_config

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


def config_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--config FILE`` and ``--data-dir DIR``, passed as ``config_path`` and ``data_dir``."""
    f = click.option("--data-dir", default=None, help="Data directory (default ./clawproxy-data).")(f)
    f = click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
                     help="YAML config file (default: configs/default.yaml).")(f)
    return f


def build_config(config_path: str | None, data_dir: str | None = None, **overrides: Any) -> Config:
    """The config file with ``--data-dir`` and dotted overrides on top (None: not given)."""
    return load_config(config_path, {"data_dir": data_dir, **overrides})


@contextmanager
def progress(description: str, total: int | None, disable: bool = False) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr; yields ``advance(n)``. Off when stderr is not a terminal (under
    `clawproxy start` it is a log file, which gets log lines instead)."""
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), disable=disable or not sys.stderr.isatty()) as bar:
        task = bar.add_task(description, total=total)

        def advance(n: int = 1) -> None:
            bar.advance(task, n)

        yield advance
