"""Tool calls: rendering offered tools, the streaming Hermes parser, and a scripted model whose
greedy output is a tool call, served by a real engine process."""

from __future__ import annotations

import json
import random

import pytest

from clawproxy.chat_template import normalize_messages
from clawproxy.engine.tools import ToolCallStreamParser, split_tool_calls
from tests.rig.engine_proc import chat, engine_process, stream_chat

SCRIPT = 'Sure.<tool_call>{"name":"ls","arguments":{}}'
TOOLS = [{"type": "function", "function": {"name": "ls", "description": "List files",
                                           "parameters": {"type": "object", "properties": {}}}}]


def _feed_in_pieces(text: str, cuts: list[int]) -> tuple[str, list[dict], list[dict]]:
    parser = ToolCallStreamParser()
    content, deltas = "", []
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    for piece in pieces:
        out = parser.feed(piece)
        content += out.content
        deltas += out.tool_calls
    out = parser.finish()
    return content + out.content, deltas + out.tool_calls, parser.calls


def test_parser_is_independent_of_how_text_is_split():
    text = ('Let me look.<tool_call>\n{"name": "read", "arguments": {"path": "a.txt"}}\n</tool_call>'
            '<tool_call>{"name": "exec", "arguments": "{\\"cmd\\": \\"ls\\"}"}</tool_call>')
    rng = random.Random(0)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 12)))
        content, deltas, calls = _feed_in_pieces(text, cuts)
        assert content == "Let me look."
        assert [c["function"]["name"] for c in calls] == ["read", "exec"]
        assert json.loads(calls[0]["function"]["arguments"]) == {"path": "a.txt"}
        assert json.loads(calls[1]["function"]["arguments"]) == {"cmd": "ls"}
        # First delta of each call: id, type and name with empty arguments; then the arguments.
        assert deltas[0]["id"].startswith("chatcmpl-tool-") and deltas[0]["function"]["arguments"] == ""
        assert deltas[1] == {"index": 0, "function": {"arguments": calls[0]["function"]["arguments"]}}
        assert deltas[2]["index"] == 1 and deltas[2]["function"]["name"] == "exec"


def test_parser_edge_cases():
    assert split_tool_calls("a < b and <tool_ is not a call") == ("a < b and <tool_ is not a call", [])
    content, calls = split_tool_calls('x<tool_call>{"oops": 1}</tool_call>y')
    assert calls == [] and content == 'x<tool_call>{"oops": 1}</tool_call>y'  # not a call: the text as written
    content, calls = split_tool_calls('<tool_call>{"name": "ls"}')  # unclosed at EOS, no args
    assert content == "" and calls[0]["function"] == {"name": "ls", "arguments": "{}"}
    content, calls = split_tool_calls('```json\n{"name": "ls", "arguments": {}}\n```', tools={"ls"})
    assert content == "" and calls[0]["function"]["name"] == "ls"  # the fenced form vLLM's plugin reads too
    content, calls = split_tool_calls('{"name": "rm", "arguments": {}}', tools={"ls"})
    assert calls == [] and content == '{"name": "rm", "arguments": {}}'  # a tool not offered stays text
    disabled = ToolCallStreamParser(enabled=False)
    assert disabled.feed("<tool_call>{}").content == "<tool_call>{}"


def test_normalize_renders_openclaw_history_for_a_template_without_tools():
    msgs = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": [{"type": "text", "text": "read it"}, {"type": "text", "text": "now"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "callfake1", "type": "function",
             "function": {"name": "read", "arguments": "{\"path\":\"hello.txt\"}"}}]},
        {"role": "tool", "content": "HELLO", "tool_call_id": "callfake1"},
    ]
    out = normalize_messages(msgs, TOOLS, native_tools=False)
    assert out[0]["role"] == "system" and "<tools>" in out[0]["content"] and '"name": "ls"' in out[0]["content"]
    assert out[1] == {"role": "user", "content": "read it\nnow"}
    assert out[2]["content"] == '<tool_call>\n{"name": "read", "arguments": {"path": "hello.txt"}}\n</tool_call>'
    assert out[3] == {"role": "tool", "content": "<tool_response>\nHELLO\n</tool_response>"}
    native = normalize_messages(msgs, TOOLS, native_tools=True)
    assert native[2]["tool_calls"][0]["function"]["arguments"] == {"path": "hello.txt"}


@pytest.fixture(scope="module")
def scripted_model_dir(default_model_dir, tmp_path_factory):
    """A 1-layer Llama whose greedy output after the chat prompt is SCRIPT then EOS.

    Attention and MLP are zeroed, so the last hidden state is the current token's embedding; each
    script token gets its own basis direction and lm_head maps it to the next token: a bigram
    machine, which works because SCRIPT's tokens are all distinct.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    seq = tok(SCRIPT, add_special_tokens=False)["input_ids"]
    start = tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True,
                                    tokenize=False)
    first = tok(start, add_special_tokens=False)["input_ids"][-1]
    chain = [first, *seq, tok.eos_token_id]
    assert len(set(chain)) == len(chain), "the script needs distinct tokens"
    hidden = 32
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=False,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0 if "norm" in name else 0.0)
        for i, (cur, nxt) in enumerate(zip(chain, chain[1:], strict=False)):
            model.model.embed_tokens.weight[cur, i] = hidden**0.5
            model.lm_head.weight[nxt, i] = 10.0
    out = tmp_path_factory.mktemp("scripted-model")
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def scripted_url(scripted_model_dir, tmp_path_factory):
    with engine_process(scripted_model_dir, tmp_path_factory.mktemp("scripted-data")) as url:
        yield url


def test_tool_call_served_non_streamed(scripted_url):
    body = {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "temperature": 0,
            "return_token_ids": True}
    r = chat(scripted_url, body)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Sure."
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"] == {"name": "ls", "arguments": "{}"}
    # Without tools offered, the same text is plain content.
    plain = chat(scripted_url, {**body, "tools": None}).json()["choices"][0]
    assert plain["finish_reason"] == "stop" and plain["message"]["content"] == SCRIPT


def test_tool_call_streamed_as_deltas(scripted_url):
    chunks, done, _ = stream_chat(scripted_url, {"messages": [{"role": "user", "content": "x"}],
                                                 "tools": TOOLS, "tool_choice": "auto",
                                                 "temperature": 0, "return_token_ids": True,
                                                 "stream_options": {"include_usage": True}})
    assert done
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    content = "".join(d.get("content") or "" for d in deltas)
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert content == "Sure." and "<tool" not in content
    assert calls[0]["function"] == {"name": "ls", "arguments": ""} and calls[0]["id"]
    assert calls[1] == {"index": 0, "function": {"arguments": "{}"}}
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "tool_calls" and all(f is None for f in finishes[:-1])
    # Every sampled token (EOS included) is reported once, in order.
    ids = [t for c in chunks[1:] if c["choices"] for t in c["choices"][0].get("token_ids", [])]
    assert len(ids) == chunks[-1]["usage"]["completion_tokens"] == 16


def test_offered_tools_reach_the_prompt(scripted_url, default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "list files"}]}],
            "tools": TOOLS, "max_tokens": 1, "return_token_ids": True}
    prompt = tok.decode(chat(scripted_url, body).json()["prompt_token_ids"])
    assert "<tools>" in prompt and '"name": "ls"' in prompt and "list files" in prompt
    assert "[{" not in prompt
