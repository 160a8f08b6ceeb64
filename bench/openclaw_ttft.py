"""TTFT and decode speed as the real OpenClaw client sees them, through the default stack.

Starts `clawproxy start --no-train` (the default engine and model) on loopback, writes
OpenClaw's config with `clawproxy openclaw-config --write` (the profile it picks for the model),
sends one conversation of N messages through the real client (`openclaw agent --local`), then
the first message again in each further session (`--sessions`), and prints per recorded turn:
session, kind, prompt tokens (and how many of them the engine's prefix cache held, from
usage.prompt_tokens_details), TTFT and total time as the proxy measured them, completion tokens
and decode tok/s, with the load average beside them. Where a later session's turn 1 prompt
differs from the first session's, it prints where and the differing text: what in OpenClaw's
prompt defeats the prefix cache.

    .venv/bin/python bench/openclaw_ttft.py [--messages 2] [--sessions 2] [--profile lean] [--max-tokens 512]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MESSAGES = ["What is the capital of France?",
            "Thanks! And how many people live there, roughly?",
            "Give me one tip for visiting it in winter."]


def wait_http(url: str, timeout: float) -> None:
    from clawproxy.engine.client import EngineClient

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            EngineClient(url).served_model_card()
            return
        time.sleep(1)
    raise SystemExit(f"{url} did not answer in {timeout:.0f} s")


def _diff_sessions(prompts: list[list[int]], model: str | None) -> None:
    """Print where each later session's first prompt leaves the first session's, and the text there."""
    if len(prompts) < 2:
        return
    from transformers import AutoTokenizer

    from clawproxy.config import load_config
    from clawproxy.engine.model import resolve_model

    tok = AutoTokenizer.from_pretrained(str(resolve_model(model or load_config(None).engine.model)))
    for k, other in enumerate(prompts[1:], start=2):
        at = next((i for i, (a, b) in enumerate(zip(prompts[0], other, strict=False)) if a != b), min(len(prompts[0]), len(other)))
        if at == len(prompts[0]) == len(other):
            print(f"session {k}: turn 1 prompt identical to session 1's ({at} tokens)")
            continue
        print(f"session {k}: turn 1 prompt leaves session 1's at token {at} of {len(prompts[0])}: "
              f"{tok.decode(prompts[0][at:at + 24])!r} -> {tok.decode(other[at:at + 24])!r}")


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2, help="messages in the conversation (1-3)")
    ap.add_argument("--profile", default=None, help="openclaw-config --profile (default: its choice)")
    ap.add_argument("--max-tokens", type=int, default=None, help="openclaw-config --max-tokens")
    ap.add_argument("--model", default=None, help="clawproxy start --model (default: the configured one)")
    ap.add_argument("--sessions", type=int, default=1, help="sessions; each later one sends the first message")
    ap.add_argument("--quantization", default=None, help="clawproxy start --quantization")
    ap.add_argument("--config", default=None, help="clawproxy start --config")
    args = ap.parse_args(argv)

    from click.testing import CliRunner

    from clawproxy.cli import main as cli
    from clawproxy.store import Store
    from tests.net import held_port
    from tests.openclaw_client import ensure_openclaw

    openclaw = ensure_openclaw()
    tmp = Path(tempfile.mkdtemp(prefix="clawproxy-ttft-"))
    with held_port() as port, held_port() as engine_port:
        start = [sys.executable, "-m", "clawproxy.cli", "start", "--no-train", "--port", str(port),
                 "--engine-port", str(engine_port), "--data-dir", str(tmp / "data")]
        if args.model:
            start += ["--model", args.model]
        if args.quantization:
            start += ["--quantization", args.quantization]
        if args.config:
            start += ["--config", args.config]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen(start, stdout=open(tmp / "clawproxy.log", "w"), stderr=subprocess.STDOUT,
                                env=env, cwd=ROOT)
    try:
        wait_http(f"http://127.0.0.1:{port}", 600)
        cfg_path = tmp / "home" / ".openclaw" / "openclaw.json"
        extra = (["--profile", args.profile] if args.profile else []) + (
            ["--max-tokens", str(args.max_tokens)] if args.max_tokens else [])
        r = CliRunner().invoke(cli, ["openclaw-config", "--port", str(port), "--write", *extra],
                               env={"OPENCLAW_CONFIG_PATH": str(cfg_path)})
        if r.exit_code:
            raise SystemExit(r.output)
        print(r.output.splitlines()[0] if r.output else "", flush=True)
        plan = [(1, m) for m in MESSAGES[: args.messages]] + [(k, MESSAGES[0]) for k in range(2, args.sessions + 1)]
        sent_at = []  # wall clock of each send: a turn belongs to the last send before it
        for session, msg in plan:
            sent_at.append(time.time())
            t0 = time.monotonic()
            openclaw.run(["agent", "--local", "--session-id", f"ttft-{session}", "--json", "-m", msg],
                         tmp / "home", cfg_path)
            print(f"  session {session}: sent {msg!r}: the client returned after {time.monotonic() - t0:.1f} s",
                  flush=True)
        time.sleep(2)  # the recorder's last batch commits
        store = Store.reader(tmp / "data" / "clawproxy.db")
        rows, firsts = [], {}
        for t in sorted(store.turns_page(None, 0, 100), key=lambda t: t["id"]):
            step = sum(at <= t["created_at"] for at in sent_at) - 1
            session, msg = plan[max(step, 0)]
            if t["kind"] == "main" and msg == MESSAGES[0] and session not in firsts:
                firsts[session] = t["prompt_token_ids"] or []
            n = len(t["completion_token_ids"] or [])
            decode_s = ((t["total_ms"] or 0) - (t["ttft_ms"] or 0)) / 1000
            usage = t["usage"] if isinstance(t["usage"], dict) else json.loads(t["usage"] or "{}")
            rows.append({"turn": t["id"], "session": session, "message": MESSAGES.index(msg) + 1, "kind": t["kind"], "prompt_tokens": len(t["prompt_token_ids"] or []),
                         "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                         "ttft_s": round((t["ttft_ms"] or 0) / 1000, 2),
                         "total_s": round((t["total_ms"] or 0) / 1000, 2), "completion_tokens": n,
                         "decode_tok_s": round((n - 1) / decode_s, 2) if n > 1 and decode_s > 0 else None,
                         "finish_reason": t["finish_reason"]})
        store.close()
        _diff_sessions(list(firsts.values()), args.model)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        if proc.poll() is None:
            proc.kill()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for row in rows:
        print(json.dumps(row))
    return rows


if __name__ == "__main__":
    main()
