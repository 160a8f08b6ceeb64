"""The wrappers Qwen2.5-Coder writes tool calls in, read whole and streamed a character at a time:
the same calls and the same text either way, and only a possible wrapper is ever held back."""

from __future__ import annotations

import json

import pytest

from clawproxy.engine.toolcalls import ToolCallScanner

TOOLS = {"read", "exec"}
CALL = '{"name": "read", "arguments": {"path": "hello.txt"}}'


def streamed(text: str, tools=TOOLS):
    scanner, content, calls = ToolCallScanner(tools), "", []
    for i in range(1, len(text) + 1):
        step = scanner.feed(text[:i])
        content += step.content
        calls += step.calls
    step = scanner.finish(text)
    return content + step.content, calls + step.calls


def whole(text: str, tools=TOOLS):
    step = ToolCallScanner(tools).finish(text)
    return step.content, step.calls


@pytest.mark.parametrize("text", [
    f"<tool_call>\n{CALL}\n</tool_call>",
    f"<tools>{CALL}</tools>",
    f"```json\n{CALL}\n```",
    f"```\n{CALL}\n```",
    CALL,
    f"  {CALL}",
    '<tool_call>{"name": "read", "arguments": "{\\"path\\": \\"hello.txt\\"}"}</tool_call>',
    f"<tool_call>{{{CALL}}}</tool_call>",  # the template's {{...}} placeholder braces copied
    f"{{{CALL}}}",  # the same braces around a bare call
    f"{{ {CALL} }}\n",
])
@pytest.mark.parametrize("read", [whole, streamed])
def test_each_wrapper_is_one_call(text, read):
    content, calls = read(text)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("read", {"path": "hello.txt"})]
    assert content.strip() == ""


@pytest.mark.parametrize("read", [whole, streamed])
def test_text_around_a_call_is_kept(read):
    content, calls = read(f"I'll read it.\n```json\n{CALL}\n```\nDone.")
    assert len(calls) == 1 and content == "I'll read it.\n\nDone."


@pytest.mark.parametrize("text", [
    "Paris is the capital of France.",
    "Here is code:\n```python\nprint('{\"name\": 1}')\n```\nThat's it.",
    '```json\n{"name": "Ada", "age": 36}\n```',           # JSON, but no tool by that name
    '```json\n{"name": "write", "arguments": {}}\n```',    # a tool the request did not offer
    "{curly} braces in prose",
    "Use <tools> wisely",
    "An unclosed fence ```json\n{\"name\": \"read\"",
    "ends with a partial opener <tool",
    '{{"name": "Ada", "age": 36}}',                        # doubled braces, no tool by that name
    f"{{{CALL} and more}}",                                # a call inside braces that hold more
    "{{template}} placeholders",
    f"{{{CALL}",                                           # the outer brace never closes
])
@pytest.mark.parametrize("read", [whole, streamed])
def test_ordinary_answers_stay_text_exactly(text, read):
    content, calls = read(text)
    assert calls == [] and content == text


def test_plain_text_streams_at_once_and_only_a_possible_wrapper_is_held():
    scanner = ToolCallScanner(TOOLS)
    assert scanner.feed("Hello there").content == "Hello there"
    assert scanner.feed("Hello there ``").content == " "  # "``" may open a fence
    assert scanner.feed("Hello there ```py").content == "```py"  # a python fence: code, released
    step = scanner.feed(f"Hello there ```py\nx\n``` and <tool_call>{CALL[:10]}")
    assert step.content == "\nx\n``` and " and step.calls == []
    step = scanner.feed(f"Hello there ```py\nx\n``` and <tool_call>{CALL}</tool_call>")
    assert step.content == "" and [c.name for c in step.calls] == ["read"]


def test_a_list_of_calls_is_several_calls():
    two = f'[{CALL}, {{"name": "exec", "arguments": {{"command": "ls"}}}}]'
    content, calls = whole(f"<tool_call>{two}</tool_call>")
    assert [c.name for c in calls] == ["read", "exec"]


@pytest.mark.parametrize("text", [f"<tool_call>\n{CALL}\n", f"```json\n{CALL}\n", f"<tools>{CALL}"])
@pytest.mark.parametrize("read", [whole, streamed])
def test_a_wrapper_left_open_at_the_end_is_a_call_if_its_body_is_one(text, read):
    content, calls = read(text)  # vLLM's hermes reads an unclosed last <tool_call> so too
    assert [c.name for c in calls] == ["read"] and content == ""


def test_unknown_tool_list_accepts_any_name():
    content, calls = whole('<tool_call>{"name": "anything", "arguments": {}}</tool_call>', tools=None)
    assert [c.name for c in calls] == ["anything"]
