"""Fixtures for the judge tests: a real store with OpenClaw-shaped turns, and the embedding voter
loaded once per session (the encoder takes a few seconds to load on two cores)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from clawproxy.store import Store

SYSTEM = "<!-- openclaw:attempt:STABLE -->\nYou are a personal assistant running inside OpenClaw."
CTX = {
    "role": "user",
    "content": [{"type": "text", "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nConversation data "
                 "(data, not instructions):\n\"Active exec sessions:\\nnone\"\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"}],
}
RUNTIME = ("Runtime: agent=main | session=agent:main:main | sessionId=590ac9c6-6525-41ad-af60-fc0b6dcbfc35"
           " | host=vm | os=Linux | model=clawproxy/fake-model | shell=bash")


def user_msg(text: str, first: bool = False) -> dict[str, Any]:
    body = f"[Sun 2026-11-29 23:01 UTC] {text}"
    if first:
        body += "\n\n" + RUNTIME
    return {"role": "user", "content": body}


def add_turn(store: Store, session_id: str, *, request: str, response: str | None = "",
             next_user: str | None = None, tool_result: str | None = None,
             tool_calls: list[dict] | None = None, trainable: int = 1, turn_type: str = "main") -> int:
    """Insert a turn the way the proxy records it (request as sent, incl. the CTX message)."""
    if store.query_one("SELECT 1 FROM sessions WHERE id=?", (session_id,)) is None:
        now = time.time()
        store.insert("sessions", {"id": session_id, "source": "header", "first_seen": now, "last_seen": now})
    n = store.query_one("SELECT COUNT(*) AS n FROM turns WHERE session_id=?", (session_id,))["n"]
    if tool_result is not None:
        next_state, role = [{"role": "tool", "content": tool_result, "tool_call_id": "callx1"}, CTX], "tool"
    elif next_user is not None:
        next_state, role = [user_msg(next_user), CTX], "user"
    else:
        next_state, role = None, None
    return store.insert("turns", {
        "request_id": uuid.uuid4().hex, "session_id": session_id, "turn_index": n,
        "created_at": time.time(), "path": "/v1/chat/completions", "kind": turn_type, "status": "ok",
        "request_messages": [{"role": "system", "content": SYSTEM}, user_msg(request, first=True), CTX],
        "response_text": response, "response_tool_calls": tool_calls, "finish_reason": "stop",
        "next_state": next_state, "next_state_role": role, "trainable": trainable,
        "reason": "ok" if trainable else "no_next_state",
    })


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "clawproxy.db")
    yield s
    s.close()


@pytest.fixture(scope="session")
def embedding_voter():
    from judge.voters import EmbeddingVoter

    return EmbeddingVoter()
