"""Tool calls for the embedded engine: the model's text back to OpenAI tool calls, read by the
one reader vLLM's plugin uses (``clawproxy.engine.toolcalls``, which lists the forms); the prompt
side is ``clawproxy.chat_template``.

``ToolCallStreamParser`` turns streamed text pieces into content and tool-call deltas without ever
showing call markup to the client. A call's first delta carries ``id``, ``type`` and
``function.name`` with empty ``arguments``; the next carries the arguments
(docs/openclaw-wire.md §3.2: OpenClaw wants id and name first, ``"{}"`` for no args).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from clawproxy.engine.toolcalls import Step, ToolCallScanner


def new_tool_call_id() -> str:
    """vLLM's style of tool-call id (``chatcmpl-tool-<hex>``)."""
    return f"chatcmpl-tool-{uuid.uuid4().hex[:24]}"


@dataclass
class ParsedDelta:
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # streamed delta shape


@dataclass
class ToolCallStreamParser:
    """Feed text pieces, get content and tool-call deltas back; ``tools``: the names the request
    offered (None: any name), as the vLLM plugin is given them."""

    enabled: bool = True
    tools: set[str] | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    _text: str = ""
    _scanner: ToolCallScanner | None = None

    def feed(self, text: str) -> ParsedDelta:
        if not self.enabled:
            return ParsedDelta(content=text)
        self._text += text
        return self._deltas(self._scan().feed(self._text))

    def finish(self) -> ParsedDelta:
        """End of generation: what was held back, as content or as a call."""
        if not self.enabled:
            return ParsedDelta()
        return self._deltas(self._scan().finish(self._text))

    def _scan(self) -> ToolCallScanner:
        if self._scanner is None:
            self._scanner = ToolCallScanner(self.tools)
        return self._scanner

    def _deltas(self, step: Step) -> ParsedDelta:
        out = ParsedDelta(content=step.content)
        for c in step.calls:
            index, call_id = len(self.calls), new_tool_call_id()
            self.calls.append({"id": call_id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}})
            out.tool_calls.append({"index": index, "id": call_id, "type": "function",
                                   "function": {"name": c.name, "arguments": ""}})
            out.tool_calls.append({"index": index, "function": {"arguments": c.arguments}})
        return out


def split_tool_calls(text: str, tools: set[str] | None = None) -> tuple[str, list[dict[str, Any]]]:
    """Non-streaming: the whole output -> (content, tool_calls)."""
    parser = ToolCallStreamParser(tools=tools)
    first, last = parser.feed(text), parser.finish()
    return first.content + last.content, parser.calls
