"""What every `clawproxy` command shares: ``-h``, the ``--config/--data-dir`` pair, the config they
load, and a progress bar (rich). Commands raise ``ClawproxyError`` as it comes; the root group in
``clawproxy.cli`` turns it into a one-line CLI message.

Light imports only: every `clawproxy` invocation loads this module.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from clawproxy.config import Config, load_config

if TYPE_CHECKING:
    from rich.console import Console

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


# Where output is not a terminal (a pipe, a file, CI), rich would lay tables out in 80 columns and
# wrap a preference's words 9 characters a line; a file has room.
PIPE_WIDTH = 200


def make_console(stderr: bool = False, **kwargs: Any) -> Console:
    """The rich Console every command prints with: the terminal's width, else ``PIPE_WIDTH``."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # COLUMNS, when set, is the width asked for; rich reads it itself
    wide = stream.isatty() or "COLUMNS" in os.environ
    return Console(stderr=stderr, width=None if wide else PIPE_WIDTH, **kwargs)


@contextmanager
def progress(description: str, total: int | None, disable: bool = False) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr; yields ``advance(n)``. Off when stderr is not a terminal (under
    `clawproxy start` it is a log file, which gets log lines instead)."""
    from rich.progress import Progress

    with Progress(console=make_console(stderr=True), disable=disable or not sys.stderr.isatty()) as bar:
        task = bar.add_task(description, total=total)

        def advance(n: int = 1) -> None:
            bar.advance(task, n)

        yield advance


@contextmanager
def steps(description: str) -> Iterator[Callable[[int, int], None]]:
    """Progress over counted steps (a build's ``[N/M]``); yields ``update(done, total)``. A bar on a
    terminal; elsewhere one line each tenth of the way, so a log shows it moving."""
    from rich.progress import Progress

    if sys.stderr.isatty():
        with Progress(console=make_console(stderr=True)) as bar:
            task = bar.add_task(description, total=None)
            yield lambda done, total: bar.update(task, completed=done, total=total)
        return
    said = [-1]

    def update(done: int, total: int) -> None:
        tenth = done * 10 // max(total, 1)
        if tenth > said[0]:
            said[0] = tenth
            print(f"{description}: {done}/{total}", file=sys.stderr, flush=True)

    yield update
