"""What OpenClaw puts around the user's words on the wire (docs/openclaw-wire.md).

Shared by the proxy (session tracking), the judge (what the user really said), the trainer (where
the OPD hint goes) and the CLI. Pure functions on message dicts; imports nothing heavy.

- Every call ends with a transient ``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`` user message that is
  never replayed in the next call (docs/openclaw-wire.md §2.5).
- Each real user message starts with a ``[Sun 2026-11-29 23:01 UTC] `` timestamp, and the first one
  carries a ``Runtime: agent=... | sessionId=...`` line (§2.2, §2.4).
- Content is a string or a list of ``{type: "text"}`` parts.
"""

from __future__ import annotations

import re
from typing import Any

CTX_MARKER = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"
_TIMESTAMP = re.compile(
    r"^\s*\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) \d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})? [A-Z]{2,5}\]\s*"
)
_RUNTIME = re.compile(r"(?m)^\s*Runtime: agent=.*$")


def content_text(content: Any) -> str:
    """A message's content as plain text: strings as is, text parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("text", "input_text"):
                parts.append(str(part.get("text") or ""))
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return str(content)


def message_text(msg: dict[str, Any]) -> str:
    """The text of a message dict (see ``content_text``)."""
    return content_text(msg.get("content"))


def is_ctx(msg: Any) -> bool:
    """OpenClaw's transient internal-context message (appended to every call, never replayed)."""
    return (
        isinstance(msg, dict)
        and msg.get("role") == "user"
        and message_text(msg).lstrip().startswith(CTX_MARKER)
    )


def strip_ctx(messages: list[Any]) -> list[Any]:
    """``messages`` without trailing internal-context messages."""
    end = len(messages)
    while end and is_ctx(messages[end - 1]):
        end -= 1
    return messages[:end]


def clean_user_text(text: str) -> str:
    """Strip OpenClaw's timestamp prefix and Runtime line, leaving what the user typed."""
    text = _TIMESTAMP.sub("", text, count=1)
    text = _RUNTIME.sub("", text)
    return text.strip()


def last_user_text(messages: list[Any]) -> str:
    """The last real user message, as the user typed it: the request a turn answered (tool loops
    included; the transient context message is skipped)."""
    for message in reversed(messages or []):
        if not isinstance(message, dict) or message.get("role") != "user" or is_ctx(message):
            continue
        text = clean_user_text(content_text(message.get("content")))
        if text:
            return text
    return ""
