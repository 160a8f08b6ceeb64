"""One recorded turn as a person reads it: what was asked, what came back, what happened next.

`clawproxy sessions show` (a table) and the dashboard (a conversation) both render from here.
"""

from __future__ import annotations

import json
from typing import Any

from clawproxy.openclaw import is_ctx

# Control characters (ESC starts ANSI, OSC 8 hyperlink and OSC 52 clipboard sequences; 0x9b is a
# one-byte CSI) and the bidi overrides that reorder what a terminal shows; \t and \n stay.
_CONTROLS = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"
             for c in [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x200E, 0x200F, *range(0x202A, 0x202F),
                       *range(0x2066, 0x206A)]
             if c not in (0x09, 0x0A)}


def printable(s: str) -> str:
    """``s`` with every control character spelled out (``\\x1b``): safe to write to a terminal."""
    return s.translate(_CONTROLS)


def message_text(msg: dict[str, Any] | None) -> str:
    """A message's text parts and its tool calls, on one line."""
    if not msg:
        return ""
    c = msg.get("content")
    if isinstance(c, list):
        c = "\n".join(p.get("text", "") for p in c if isinstance(p, dict))
    text = c if isinstance(c, str) else ""
    calls = [call_text(tc) for tc in msg.get("tool_calls") or () if isinstance(tc, dict)]
    return " ".join([text, *calls]).strip()


def call_text(tc: dict[str, Any]) -> str:
    """A tool call as a person reads it: ``→ read(path=hello.txt)``."""
    fn = tc.get("function")
    if not isinstance(fn, dict):
        fn = {}
    args = fn.get("arguments")
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        inner = ", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in parsed.items())
    else:
        inner = str(args or "")
    return f"→ {fn.get('name')}({inner})"


def said(msg: dict[str, Any] | None) -> str:
    """What a user-side message was: the user's words, or a tool result labelled as one."""
    if msg and msg.get("role") == "tool":
        name = msg.get("name")
        return f"tool result{f' ({name})' if name else ''}: {message_text(msg)}"
    return message_text(msg)


def turn_view(t: dict[str, Any], trained_step: int | None = None,
              skipped: str | None = None) -> dict[str, Any]:
    """A turn row (``Store.session_turns``) as text: request (the last user message or tool
    result, OpenClaw's injected context left out), response, tool calls, next state, kind, status,
    and why it is or is not trainable (``trained_step``/``skipped``: what the trainer did with it)."""
    msgs = [m for m in (t.get("request_messages") or []) if isinstance(m, dict)]
    users = [m for m in msgs if m.get("role") in ("user", "tool") and not is_ctx(m)]
    calls = [call_text(tc) for tc in t.get("response_tool_calls") or () if isinstance(tc, dict)]
    ns = [said(m) for m in t.get("next_state") or [] if isinstance(m, dict)]
    status = f"{t['status']} {t.get('http_status') or ''} {t.get('finish_reason') or ''}"
    if not t["trainable"]:
        why = f"not trainable: {t.get('reason')}"
    elif trained_step is not None:
        why = f"trained in step {trained_step}"
    elif skipped:
        why = f"trainable, skipped by the trainer: {skipped}"
    elif t.get("judge_score") is None:
        why = "trainable, waiting for the judge" if ns else "trainable, waiting for the next state"
    else:
        why = "trainable, judged, waiting for the trainer"
    return {
        "id": t.get("id"),
        "index": t.get("turn_index"),
        "created_at": t.get("created_at"),
        "kind": t["kind"] + (f"/{t['side_kind']}" if t.get("side_kind") else ""),
        "status": " ".join(status.split()),
        "trainable": bool(t["trainable"]),
        "reason": t.get("reason"),
        "why": why,
        "request": said(users[-1]) if users else "",
        "response": t.get("response_text") or "",
        "tool_calls": calls,
        "next_state": ns,
        "score": t.get("judge_score"),
        "hint": t.get("judge_hint"),
        "weight_version": t.get("weight_version"),
    }
