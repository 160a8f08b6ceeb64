"""How big is the real OpenClaw's first request, per `openclaw-config` profile and context window?

Runs the real client (openclaw@2026.9.6, installed into the test cache on first use) once per
profile and window against a fake upstream that records the request, and prints:
- tools: how many tool schemas OpenClaw sent;
- estimate: OpenClaw's own count, ceil(chars * 1.25 / 4) over message text + JSON of the tools,
  which is what it clamps max_completion_tokens by;
- tokens: the prompt as the embedded engine renders it for the default model (SmolLM2), tools
  included;
- out: the max_completion_tokens OpenClaw sent.
The `estimate` column is what clawproxy/openclaw_setup.py's PROFILES table holds.

    .venv/bin/python bench/openclaw_prompts.py [--windows 8192 32768 131072] [--profiles default lean chat]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def serve_fake() -> tuple[str, object]:
    """The fake upstream on a loopback port, in a thread; returns its URL and state."""
    import socket

    from aiohttp import web

    from tests.rig.fake_upstream import FakeUpstream

    fake = FakeUpstream()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(fake.app())
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return f"http://127.0.0.1:{port}", fake


def text_chars(messages: list[dict]) -> int:
    from clawproxy.openclaw import message_text

    return sum(len(message_text(m)) for m in messages)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=int, nargs="+", default=[8192, 32768, 131072])
    p.add_argument("--profiles", nargs="+", default=["default", "lean", "chat"])
    args = p.parse_args()

    from transformers import AutoTokenizer

    from clawproxy.chat_template import render_chat
    from clawproxy.engine.model import resolve_model
    from clawproxy.openclaw_setup import plan, provider_block
    from tests.openclaw_client import ensure_openclaw

    openclaw = ensure_openclaw()
    tok = AutoTokenizer.from_pretrained(resolve_model("default"))
    url, fake = serve_fake()
    rows = []
    for profile in args.profiles:
        for window in args.windows:
            fake.received.clear()
            with tempfile.TemporaryDirectory() as tmp:
                home, ws = Path(tmp) / "home", Path(tmp) / "ws"
                ws.mkdir()
                block = provider_block(f"{url}/v1", "fake-model", "sk-bench", plan(window, 512, profile))
                cfg = Path(tmp) / "openclaw.json"
                cfg.write_text(json.dumps(block))
                openclaw.run(["agent", "exec", "--config", str(cfg), "--cwd", str(ws), "--json",
                              "Say hello in five words."], home)
            body = next(r.body for r in fake.received if r.path.endswith("/chat/completions"))
            tools = body.get("tools") or []
            chars = text_chars(body["messages"]) + (len(json.dumps(tools, separators=(",", ":"))) if tools else 0)
            text = render_chat(tok, body["messages"], tools or None, add_generation_prompt=True, tools_as_text=True)
            rows.append({"profile": profile, "window": window, "tools": len(tools),
                         "estimate": math.ceil(chars * 1.25 / 4),
                         "tokens": len(tok(text, add_special_tokens=False)["input_ids"]),
                         "out": body.get("max_completion_tokens", body.get("max_tokens"))})
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'profile':8} {'window':>7} {'tools':>5} {'estimate':>8} {'tokens':>7} {'out':>5}")
    for r in rows:
        print(f"{r['profile']:8} {r['window']:>7} {r['tools']:>5} {r['estimate']:>8} {r['tokens']:>7} {r['out']!s:>5}")


if __name__ == "__main__":
    main()
