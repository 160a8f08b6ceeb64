"""How OpenAI chat messages become the prompt text a model generates from (no torch: the trainer imports it).

Messages are normalised the way vLLM does before templating (content-part arrays joined into a
string; ``tool_calls`` arguments decoded to objects for templates that expect them) and rendered by
the model's own chat template with ``tools=``.

Tool calls are written Hermes/Qwen style, which vLLM's ``hermes`` tool parser reads::

    <tool_call>
    {"name": "read", "arguments": {"path": "a.txt"}}
    </tool_call>

When the chat template knows about tools (Qwen2.5/3, Hermes) it defines this format itself. When
it does not (SmolLM2's template ignores ``tools``), engines differ (``EngineSpec.tools_as_text``):
- the embedded engine describes the tools in the system message in the same Hermes format and
  renders earlier assistant tool calls and tool results as text, so that any model can be offered
  tools and its answers parsed the same way (``clawproxy.engine.tools``);
- vLLM hands the template the messages and tools as they are, and the template drops what it
  does not know (the tools, the calls; a tool result keeps its ``tool`` role).
The trainer renders the OPD teacher's prompt the way the serving engine rendered the student's
(``tests/engine/test_vllm_real.py`` checks it token for token against the real vLLM).
"""

from __future__ import annotations

import json
from typing import Any

from clawproxy.openclaw import content_text

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"


def template_supports_tools(chat_template: str | None) -> bool:
    return chat_template is not None and "tools" in chat_template


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
    tools_as_text: bool,
    **template_kwargs: Any,
) -> str:
    """The prompt text an engine generates from: ``normalize_messages`` + the model's chat
    template; ``tools_as_text`` as the engine's ``EngineSpec`` says (True: the embedded engine,
    False: vLLM; see the module docstring). One function for the engines and for the trainer's OPD
    teacher prompt, so the teacher's prompt differs from the recorded (student) prompt by the hint
    alone: rendered any other way the teacher - student gap would measure the rendering instead of
    the hint."""
    native = not tools_as_text or template_supports_tools(getattr(tokenizer, "chat_template", None))
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
