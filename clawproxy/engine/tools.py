"""Chat rendering and tool calls for the embedded engine.

Rendering: OpenAI messages are normalised the way vLLM does before templating (content-part
arrays joined into a string; ``tool_calls`` arguments decoded to objects for templates that
expect them) and rendered by the model's own chat template with ``tools=``.

Tool-call format: Hermes/Qwen style, which vLLM's ``hermes`` tool parser reads::

    <tool_call>
    {"name": "read", "arguments": {"path": "a.txt"}}
    </tool_call>

When the chat template knows about tools (Qwen2.5/3, Hermes) it defines this format itself. When
it does not (SmolLM2's template ignores ``tools``), we describe the tools in the system message in
the same Hermes format and render earlier assistant tool calls and tool results as text, so that
any model can be offered tools and its answers parsed the same way.

``ToolCallStreamParser`` splits streamed text into content and tool-call deltas without ever
showing ``<tool_call>`` markup to the client; vLLM's ``hermes_tool_parser.py`` does the same job.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from clawproxy.openclaw import content_text

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"


def template_supports_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in chat_template


def _tool_call_text(call: dict[str, Any]) -> str:
    fn = call.get("function") or {}
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            pass
    return f"{TOOL_OPEN}\n{json.dumps({'name': fn.get('name', ''), 'arguments': args})}\n{TOOL_CLOSE}"


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    """Hermes-style tool instructions for templates that do not render ``tools`` themselves."""
    lines = [
        "# Tools",
        "",
        "You may call one or more functions to assist with the user query.",
        "",
        "You are provided with function signatures within <tools></tools> XML tags:",
        "<tools>",
    ]
    for tool in tools:
        lines.append(json.dumps(tool.get("function", tool)))
    lines += [
        "</tools>",
        "",
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:",
        "<tool_call>",
        '{"name": <function-name>, "arguments": <args-json-object>}',
        "</tool_call>",
    ]
    return "\n".join(lines)


def normalize_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, native_tools: bool
) -> list[dict[str, Any]]:
    """OpenAI messages -> what a HF chat template renders (see module docstring)."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        role = msg.get("role")
        text = content_text(msg.get("content"))
        calls = msg.get("tool_calls") or []
        if native_tools:
            item: dict[str, Any] = {"role": role, "content": text}
            if calls:
                item["tool_calls"] = [
                    {
                        "id": c.get("id"),
                        "type": "function",
                        "function": {
                            "name": (c.get("function") or {}).get("name", ""),
                            "arguments": _json_or_str((c.get("function") or {}).get("arguments")),
                        },
                    }
                    for c in calls
                ]
            for key in ("tool_call_id", "name", "reasoning_content"):
                if msg.get(key) is not None:
                    item[key] = msg[key]
            out.append(item)
            continue
        if calls:
            text = "\n".join([text] * bool(text) + [_tool_call_text(c) for c in calls])
        if role == "tool":
            text = f"<tool_response>\n{text}\n</tool_response>"
        if role == "developer":
            role = "system"
        out.append({"role": role, "content": text})
    if tools and not native_tools:
        instructions = tools_system_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + instructions}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
) -> str:
    """The prompt text the embedded engine generates from: ``normalize_messages`` + the model's
    chat template. One function for the engine and for the trainer's OPD teacher prompt, so the
    teacher's prompt differs from the recorded (student) prompt by the hint alone: rendered any
    other way it would lose the tool instructions, or fail on tool-call history, and the
    teacher - student gap would measure the rendering instead of the hint."""
    native = template_supports_tools(getattr(tokenizer, "chat_template", None))
    return tokenizer.apply_chat_template(
        normalize_messages(messages, tools, native),
        tools=tools if native else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **template_kwargs,
    )


def _json_or_str(args: Any) -> Any:
    if isinstance(args, str):
        try:
            return json.loads(args) if args.strip() else {}
        except ValueError:
            return args
    return args if args is not None else {}


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
