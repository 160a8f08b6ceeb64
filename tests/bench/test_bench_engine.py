"""bench/engine.py's OpenClaw-shaped prompt: the size asked for, in OpenClaw's message order."""

from __future__ import annotations

from tests.bench.util import bench_module


def test_openclaw_prompt_has_the_size_and_shape_asked_for(default_model_dir):
    from transformers import AutoTokenizer

    from clawproxy.chat_template import render_chat

    bench = bench_module("engine")
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    body, history, transient = bench.openclaw_turns(tokenizer, 2900)
    n = len(tokenizer(render_chat(tokenizer, body["messages"], body["tools"], tools_as_text=True),
                      add_special_tokens=False)["input_ids"])
    assert 2600 < n <= 2900
    assert [m["role"] for m in body["messages"]] == ["system", "user", "user"]
    assert body["messages"][-1] is transient and "OPENCLAW_INTERNAL_CONTEXT" in str(transient)
    assert {t["function"]["name"] for t in body["tools"]} == set(bench.LEAN_TOOLS)
    assert "## Skills" not in history[0]["content"]
