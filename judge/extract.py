"""What a voter sees: the user's request, the response, and what happened next.

A turns row stores messages exactly as OpenClaw sent them, which hides the user's words behind
wire furniture: a transient ``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`` user message at the end of
every call, a ``[Sun 2026-11-29 23:01 UTC] `` timestamp prefix, a ``Runtime: agent=...`` line on the
first message, and content that may be a string or a list of ``{type: text}`` parts. The judge
needs the user's real text (a verdict on the reply without the request is a guess), so this module peels all of that off, for the request and for the next state alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from clawproxy.openclaw import clean_user_text, content_text, is_ctx, last_user_text


@dataclass
class JudgeInput:
    """One turn as the judge sees it. ``role`` is the next state's role: 'user' or 'tool'."""

    request: str
    response: str
    next_state: str
    role: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def last_user_request(messages: list[dict[str, Any]]) -> str:
    """The last real user message: the request this turn answered (tool loops included)."""
    return last_user_text(messages)


def render_tool_calls(tool_calls: list[dict[str, Any]] | None) -> str:
    """Tool calls as ``name(arguments)`` lines, the way a person would read them."""
    lines = []
    for call in tool_calls or []:
        fn = call.get("function") or {}
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = orjson.dumps(args).decode() if args is not None else ""
        lines.append(f"{fn.get('name') or '?'}({args})")
    return "\n".join(lines)


def next_state_text(messages: list[dict[str, Any]] | None, role: str | None) -> str:
    """The next state as text: the user's reply (cleaned) or the tool results, in order."""
    texts = []
    for message in messages or []:
        if is_ctx(message):
            continue
        if message.get("role") == "assistant":
            continue
        text = content_text(message.get("content"))
        if message.get("role") == "user":
            text = clean_user_text(text)
        if text.strip():
            texts.append(text.strip())
    return "\n".join(texts)


def from_turn(turn: dict[str, Any]) -> JudgeInput:
    """Build the judge's input from a ``turns`` row (JSON columns already decoded by the store)."""
    messages = turn.get("request_messages") or []
    tool_calls = turn.get("response_tool_calls") or []
    response = (turn.get("response_text") or "").strip()
    rendered = render_tool_calls(tool_calls)
    if rendered:
        response = f"{response}\n[tool calls]\n{rendered}".strip()
    next_messages = turn.get("next_state") or []
    role = turn.get("next_state_role")
    if role not in ("user", "tool"):
        roles = [m.get("role") for m in next_messages if not is_ctx(m)]
        role = "tool" if roles and all(r == "tool" for r in roles) else "user"
    return JudgeInput(
        request=last_user_request(messages),
        response=response,
        next_state=next_state_text(next_messages, role),
        role=role,
        tool_calls=list(tool_calls),
    )
