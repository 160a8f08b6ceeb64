"""One way to put an instruction into a chat request: appended to the last real user message.

The proxy serves a user's tried or preferred instruction this way (``clawproxy/proxy/trying.py``),
and the trainer's distillation teacher sees its hint the same way (``trainer/batch.py``), so what
the user was served under and what the teacher is conditioned on are the same text at the same
place. It follows OpenClaw's ~2.7k-token system prompt and the earlier turns, so the engine's
prefix cache still holds everything before the last user message.
"""

from __future__ import annotations

from typing import Any

from clawproxy.openclaw import is_ctx

HINT_TEMPLATE = "[User's hint: {hint}]"


def add_hint(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """The recorded messages with ``[User's hint: ...]`` appended to the last real user message.

    "Real" skips OpenClaw's transient ``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`` user message, which
    the student saw too and the teacher keeps. Messages are copied, never modified in place.
    """
    out = [dict(m) for m in messages]
    users = [i for i, m in enumerate(out) if m.get("role") == "user"]
    if not users:
        raise ValueError("no user message to attach the hint to")
    real = [i for i in users if not is_ctx(out[i])]
    idx = (real or users)[-1]
    suffix = HINT_TEMPLATE.format(hint=hint.strip())
    content = out[idx].get("content")
    if isinstance(content, list):
        parts = [dict(p) if isinstance(p, dict) else p for p in content]
        text_parts = [i for i, p in enumerate(parts) if isinstance(p, dict) and p.get("type") == "text"]
        if text_parts:
            j = text_parts[-1]
            parts[j]["text"] = parts[j].get("text", "") + "\n\n" + suffix
        else:
            parts.append({"type": "text", "text": suffix})
        out[idx]["content"] = parts
    else:
        out[idx]["content"] = (content or "") + "\n\n" + suffix
    return out
