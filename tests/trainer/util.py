"""Helpers for trainer tests: write judged turns into a real Store the way the proxy and judge do,
and load the bench scripts that drive the trainer."""

from __future__ import annotations

import importlib.util
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

from clawproxy.store import Store


def insert_turn(
    store: Store,
    *,
    prompt_ids: list[int] | None,
    completion_ids: list[int] | None,
    logps: list[float] | None = None,
    score: int | None = 1,
    hint: str | None = None,
    weight_version: int = 0,
    messages: list[dict[str, Any]] | None = None,
    finish_reason: str = "stop",
    trainable: int = 1,
    kind: str = "main",
    tools: list[dict[str, Any]] | None = None,
    params: dict[str, Any] | None = None,
) -> int:
    """One recorded main turn (+ its judgment when ``score`` is not None); returns the turn id."""
    if logps is None and completion_ids is not None:
        logps = [-1.0] * len(completion_ids)
    turn_id = store.insert(
        "turns",
        {
            "request_id": uuid.uuid4().hex,
            "created_at": time.time(),
            "path": "/v1/chat/completions",
            "kind": kind,
            "status": "ok",
            "request_messages": messages or [{"role": "user", "content": "hello"}],
            "request_tools": tools,
            "request_params": params,
            "prompt_token_ids": prompt_ids,
            "completion_token_ids": completion_ids,
            "completion_logprobs": logps,
            "finish_reason": finish_reason,
            "weight_version": weight_version,
            "trainable": trainable,
            "reason": "ok" if trainable else "side",
        },
    )
    if score is not None:
        store.insert(
            "judgments",
            {"turn_id": turn_id, "score": score, "hint": hint, "voter": "test", "created_at": time.time()},
        )
    return turn_id


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
