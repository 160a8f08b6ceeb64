"""The one reader of a model's tool calls: the embedded engine (``clawproxy.engine.tools``), vLLM's
``qwen_fenced`` plugin (``clawproxy.engine.vllm.tool_parsers``) and the agent benchmark's malformed-call
check (``clawproxy.simulate.agent_tasks``) all read calls here. No vLLM import.

Qwen2.5's chat template asks for ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``, which
vLLM's ``hermes`` parser reads. Qwen2.5-Coder-1.5B picks the right tool and arguments but often
wraps the same JSON otherwise: a fenced ```json block, or ``<tools>…</tools>`` (the tag its system
prompt lists the tools in). ``ToolCallScanner`` reads all three, plus an answer that is one bare
JSON object, also inside the template's doubled ``{{ }}`` braces. A JSON payload is a call only
when it names a tool the request offered, so a code block in an ordinary answer stays text.

The scanner is fed the whole text so far and returns what became final since the last feed: text
to stream as content, and complete calls. Only a possible wrapper is held back (at most one wrapper
long); everything else streams at once. ``finish()`` releases what is still held at the end; a
wrapper still open there is a call if its body is one (vLLM's ``hermes`` reads an unclosed last
``<tool_call>`` so too).

The forms, listed once (``WRAPPERS``, ``FENCE_TAGS``): ``<tool_call>…</tool_call>``,
``<tools>…</tools>``, a fenced block tagged ``json`` or untagged, and a whole answer that is one
JSON object, bare or in doubled braces. The payload is a call object or a list of them, with
``arguments`` (or ``parameters``) as an object or as JSON text of one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# opener -> closer; "" closes a bare JSON object by its own braces
WRAPPERS = {"<tool_call>": "</tool_call>", "<tools>": "</tools>", "```": "```"}
FENCE_TAGS = ("", "json")  # a fenced block in another language is code, never a call
END_TOKENS = ("<|im_end|>", "<|endoftext|>")  # Qwen's end of an answer: nothing more will come


@dataclass
class Call:
    name: str
    arguments: str  # JSON text of an object


@dataclass
class Step:
    content: str = ""
    calls: list[Call] = field(default_factory=list)


def parse_calls(payload: str, tools: set[str] | None) -> list[Call] | None:
    """The calls in one wrapper's JSON (an object or a list of them); None when it is not calls."""
    try:
        data = json.loads(payload)
    except ValueError:
        inner = payload.strip()
        if not (inner.startswith("{{") and inner.endswith("}}")):
            return None
        try:  # the template's own {{...}} placeholder braces, copied around the JSON
            data = json.loads(inner[1:-1])
        except ValueError:
            return None
    items = data if isinstance(data, list) else [data]
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict) or (tools is not None and item["name"] not in tools):
            return None
        calls.append(Call(item["name"], json.dumps(args, ensure_ascii=False)))
    return calls or None


class ToolCallScanner:
    """Feed it the text so far; it says what to stream (see the module docstring)."""

    def __init__(self, tools: set[str] | None):
        self.tools = tools  # None: any name (the request listed no tools we could read)
        self.done = 0  # chars of the text already released, as content or as calls

    def feed(self, text: str) -> Step:
        return self._scan(text, final=False)

    def finish(self, text: str) -> Step:
        return self._scan(text, final=True)

    def _scan(self, text: str, final: bool) -> Step:
        out = Step()
        while self.done < len(text):
            start = self._candidate(text)
            if start is None:
                out.content += text[self.done:]
                self.done = len(text)
                break
            out.content += text[self.done:start]
            self.done = start
            end, calls = self._wrapper(text, start)
            if end is None:  # still open (or a partial opener): hold it, unless the text ended
                if final:
                    calls = self._unclosed(text, start)
                    if calls:
                        out.calls += calls
                    else:
                        out.content += text[start:]
                    self.done = len(text)
                break
            if calls:
                out.calls += calls
            else:
                out.content += text[start:end]
            self.done = end
        return out

    def _candidate(self, text: str) -> int | None:
        """Where the first possible wrapper starts at or after ``done``; None: nothing to hold."""
        best = None
        for opener in WRAPPERS:
            i = text.find(opener, self.done)
            if i < 0:  # a partial opener at the very end may still become one
                i = next((len(text) - k for k in range(len(opener) - 1, 0, -1)
                          if len(text) - k >= self.done and text.endswith(opener[:k])), -1)
            if i >= 0 and (best is None or i < best):
                best = i
        if not text[:self.done].strip():  # the answer so far is blank: it may be one bare object
            i = len(text) - len(text[self.done:].lstrip())
            if i < len(text) and text[i] == "{" and (best is None or i < best):
                best = i
        return best

    def _wrapper(self, text: str, start: int) -> tuple[int | None, list[Call] | None]:
        """(end, calls) of the wrapper at ``start``: end None while it may still be open; calls None
        when it turned out to be text (it then ends as soon as that is certain)."""
        rest = text[start:]
        opener = next((o for o in WRAPPERS if rest.startswith(o)), None)
        if opener is None:
            if any(o.startswith(rest) for o in WRAPPERS):
                return None, None  # a partial opener
            return self._bare(text, start)
        body_at = start + len(opener)
        if opener == "```":
            newline = text.find("\n", body_at)
            tag = text[body_at:newline if newline >= 0 else len(text)].strip()
            if not any(t.startswith(tag) for t in FENCE_TAGS) or (newline >= 0 and tag not in FENCE_TAGS):
                return body_at, None  # a code fence in another language: text
            if newline < 0:
                return None, None
            body_at = newline + 1
        body = text[body_at:]
        if body.strip() and body.lstrip()[0] not in "{[":
            return body_at, None  # prose after the opener: not a call
        close = text.find(WRAPPERS[opener], body_at)
        if close < 0:
            return None, None
        end = close + len(WRAPPERS[opener])
        return end, parse_calls(text[body_at:close], self.tools)

    def _unclosed(self, text: str, start: int) -> list[Call] | None:
        """At the end of the text, the calls in a wrapper that never closed, as vLLM's ``hermes``
        reads a last ``<tool_call>`` without its ``</tool_call>``; None when it holds no whole call."""
        opener = next((o for o in WRAPPERS if text.startswith(o, start)), None)
        if opener is None:
            return None
        body_at = start + len(opener)
        if opener == "```":
            newline = text.find("\n", body_at)
            if newline < 0 or text[body_at:newline].strip() not in FENCE_TAGS:
                return None
            body_at = newline + 1
        return parse_calls(text[body_at:], self.tools)

    def _bare(self, text: str, start: int) -> tuple[int | None, list[Call] | None]:
        inner_at = len(text) - len(text[start + 1:].lstrip())
        if text[inner_at:inner_at + 1] != "{":
            return self._object(text, start)
        # {{...}}: the template's placeholder braces copied around a bare call
        end, calls = self._object(text, inner_at)
        if end is None or calls is None:
            return (None, None) if end is None else (start + 1, None)
        close = len(text) - len(text[end:].lstrip())
        if close == len(text):
            return None, None  # the outer brace may still come
        return (close + 1, calls) if text[close] == "}" else (start + 1, None)

    def _object(self, text: str, start: int) -> tuple[int | None, list[Call] | None]:
        inner = text[start + 1:].lstrip()
        if inner and inner[0] != '"':
            return start + 1, None  # "{" then no key: prose or code, not a call
        try:
            _, length = json.JSONDecoder().raw_decode(text[start:])
        except ValueError:
            return None, None  # incomplete (or never JSON: released by finish)
        end = start + length
        return end, parse_calls(text[start:end], self.tools)


def tool_names(tools: Any) -> set[str] | None:
    """The function names a request offered (OpenAI ``tools``: vLLM's request objects or the JSON
    dicts), or None when none can be read."""
    names = set()
    for tool in tools or []:
        if isinstance(tool, dict):
            fn = tool.get("function", tool)
            name = fn.get("name") if isinstance(fn, dict) else None
        else:
            fn = getattr(tool, "function", None)
            name = getattr(fn, "name", None) if fn is not None else getattr(tool, "name", None)
        if isinstance(name, str):
            names.add(name)
    return names or None
