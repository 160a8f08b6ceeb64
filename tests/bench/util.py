"""Load the bench scripts, which are a folder of scripts, not a package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` loaded as a module (bench/ is a folder of scripts, not a package)."""
    bench = Path(__file__).resolve().parents[2] / "bench"
    if str(bench) not in sys.path:  # the scripts import their neighbours (_env, oracle) as a script would
        sys.path.insert(0, str(bench))
    path = bench / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod
