"""Tool calls for the embedded engine: the model's Hermes-style ``<tool_call>`` text back to OpenAI
tool calls (the prompt side is ``clawproxy.chat_template``).

``ToolCallStreamParser`` splits streamed text into content and tool-call deltas without ever
showing ``<tool_call>`` markup to the client; vLLM's ``hermes_tool_parser.py`` does the same job.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from clawproxy.chat_template import TOOL_CLOSE, TOOL_OPEN


def new_tool_call_id() -> str:
    """vLLM's style of tool-call id (``chatcmpl-tool-<hex>``)."""
    return f"chatcmpl-tool-{uuid.uuid4().hex[:24]}"


def parse_tool_call_json(body: str) -> dict[str, Any] | None:
    """``{"name": ..., "arguments": {...}}`` -> an OpenAI tool call, or None when malformed."""
    try:
        obj = json.loads(body.strip())
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        args_text = args if args.strip() else "{}"
    else:
        args_text = json.dumps(args if args is not None else {}, ensure_ascii=False)
    return {
        "id": new_tool_call_id(),
        "type": "function",
        "function": {"name": obj["name"], "arguments": args_text},
    }


@dataclass
class ParsedDelta:
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # streamed delta shape


@dataclass
class ToolCallStreamParser:
    """Incremental Hermes parser: feed text pieces, get content and tool-call deltas back.

    Text that could be the start of ``<tool_call>`` is held back until it is decided. A call's
    first delta carries ``id``, ``type`` and ``function.name`` with empty ``arguments``; the next
    carries the arguments (docs/openclaw-wire.md §3.2: OpenClaw wants id and name first, ``"{}"`` for no args).
    A block that never parses as a call is returned as ordinary content.
    """

    enabled: bool = True
    calls: list[dict[str, Any]] = field(default_factory=list)
    _buf: str = ""
    _in_call: bool = False

    def feed(self, text: str) -> ParsedDelta:
        out = ParsedDelta()
        if not self.enabled:
            out.content = text
            return out
        self._buf += text
        while True:
            if not self._in_call:
                idx = self._buf.find(TOOL_OPEN)
                if idx >= 0:
                    out.content += self._buf[:idx]
                    self._buf = self._buf[idx + len(TOOL_OPEN) :]
                    self._in_call = True
                    continue
                keep = _partial_suffix(self._buf, TOOL_OPEN)
                out.content += self._buf[: len(self._buf) - keep]
                self._buf = self._buf[len(self._buf) - keep :]
                return out
            idx = self._buf.find(TOOL_CLOSE)
            if idx < 0:
                return out
            body, self._buf = self._buf[:idx], self._buf[idx + len(TOOL_CLOSE) :]
            self._in_call = False
            self._emit(body, out)

    def finish(self) -> ParsedDelta:
        """End of generation: an unclosed block is parsed if it is a complete call."""
        out = ParsedDelta()
        if self._in_call:
            self._emit(self._buf, out)
        else:
            out.content += self._buf
        self._buf, self._in_call = "", False
        return out

    def _emit(self, body: str, out: ParsedDelta) -> None:
        call = parse_tool_call_json(body)
        if call is None:
            out.content += TOOL_OPEN + body
            return
        index = len(self.calls)
        self.calls.append(call)
        fn = call["function"]
        out.tool_calls.append(
            {
                "index": index,
                "id": call["id"],
                "type": "function",
                "function": {"name": fn["name"], "arguments": ""},
            }
        )
        out.tool_calls.append({"index": index, "function": {"arguments": fn["arguments"]}})


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def split_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """Non-streaming: the whole output -> (content, tool_calls)."""
    parser = ToolCallStreamParser()
    first, last = parser.feed(text), parser.finish()
    return first.content + last.content, parser.calls
