"""Helpers for trainer tests: write judged turns into a real Store the way the proxy and judge do."""

from __future__ import annotations

import time
import uuid
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
    turn_type: str = "main",  # main | side | retry: the kind column
    tools: list[dict[str, Any]] | None = None,
    params: dict[str, Any] | None = None,
    user: str | None = None,
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
            "kind": turn_type,
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
            "user": user,
        },
    )
    if score is not None:
        store.insert(
            "judgments",
            {"turn_id": turn_id, "score": score, "hint": hint, "voter": "test", "created_at": time.time()},
        )
    return turn_id
