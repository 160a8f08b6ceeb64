"""Each candidate model and OpenClaw profile through the real client: does it hold the conversation?

For every (model, profile) pair: `clawproxy start --no-train --model M` (vLLM unless --engine
embedded), `openclaw-config --write --profile P`, then with the real OpenClaw:
- five fixed factual questions in one session (`openclaw agent --local`): how many answers stop
  (finish_reason stop, not cut at maxTokens), how many are right (a fixed pattern per question),
  TTFT of turns 1 and 2 (turn 2 reuses the prefix cache) and decode tok/s, as the proxy measured;
- one task that needs the `read` tool, in its own session (`openclaw agent exec --cwd`): whether a
  read call ran and the answer holds the file's secret word (profiles with tools only).

    .venv/bin/python bench/openclaw_models.py --pairs qwen2.5-coder-1.5b:lean qwen2.5-coder-1.5b:chat
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _env import ROOT, reserve_port

from tests.net import stop

QUESTIONS = [  # (question, what a right answer says)
    ("What is the capital of France?", r"\bparis\b"),
    ("Which planet is the largest in our solar system?", r"\bjupiter\b"),
    ("What is the chemical symbol for gold?", r"\bau\b"),
    ("How many legs does a spider have?", r"\b(8|eight)\b"),
    ("Who wrote Romeo and Juliet?", r"\bshakespeare\b"),
]
SECRET = "marmalade"


def wait_ready(url: str, proc: subprocess.Popen | None, timeout: float) -> None:
    """Until ``url`` serves its model card; SystemExit if ``proc`` (clawproxy start) exits first."""
    from clawproxy.engine.client import EngineClient

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"clawproxy start exited with {proc.returncode}")
        try:
            EngineClient(url).served_model_card()
            return
        except Exception:
            time.sleep(1)
    raise SystemExit(f"{url} did not answer in {timeout:.0f} s")


def run_pair(model: str, profile: str, engine: str, openclaw, quantization: str = "auto") -> dict:
    from click.testing import CliRunner

    from clawproxy.cli import main as cli
    from clawproxy.config import load_config
    from clawproxy.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="clawproxy-models-"))
    port, engine_port = reserve_port(), reserve_port()
    start = [sys.executable, "-m", "clawproxy.cli", "start", "--no-train", "--no-judge", "--port", str(port),
             "--engine-port", str(engine_port), "--data-dir", str(tmp / "data"), "--model", model,
             "--engine", engine, "--quantization", quantization]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.Popen(start, stdout=open(tmp / "clawproxy.log", "w"), stderr=subprocess.STDOUT,
                            env=env, cwd=ROOT)
    served = load_config(None, {"engine.model": model, "engine.kind": engine, "engine.quantization": quantization})
    row: dict = {"model": model, "profile": profile, "engine": engine, "quantization": served.engine.quantization}
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, 1200)
        row["ready_s"] = round(time.monotonic() - t0, 1)
        home = tmp / "home"
        cfg_path = home / ".openclaw" / "openclaw.json"
        r = CliRunner().invoke(cli, ["openclaw-config", "--port", str(port), "--write", "--profile", profile],
                               env={"OPENCLAW_CONFIG_PATH": str(cfg_path)})
        if r.exit_code:
            raise SystemExit(r.output)
        answers = []
        for q, _ in QUESTIONS:
            try:
                out = openclaw.run(["agent", "--local", "--session-id", "facts", "--json", "-m", q], home, cfg_path)
                answers.append(out["payloads"][0]["text"] if out.get("payloads") else "")
            except AssertionError as e:
                answers.append(f"<client failed: {str(e)[-200:]}>")
        row["right"] = sum(bool(re.search(p, a.lower())) for (_, p), a in zip(QUESTIONS, answers, strict=True))
        row["answers"] = [a[:160] for a in answers]
        time.sleep(2)  # the recorder's last batch commits
        store = Store.reader(tmp / "data" / "clawproxy.db")
        turns = [t for t in store.turns_page(None, 0, 100) if t["kind"] == "main"]
        turns.sort(key=lambda t: t["id"])
        store.close()
        row["stop"] = f"{sum(t['finish_reason'] == 'stop' for t in turns)}/{len(turns)}"
        row["ttft_s"] = [round((t["ttft_ms"] or 0) / 1000, 1) for t in turns[:2]]
        row["prompt_tokens"] = [len(t["prompt_token_ids"] or []) for t in turns[:2]]
        rates = []
        for t in turns:
            n = len(t["completion_token_ids"] or [])
            decode_s = ((t["total_ms"] or 0) - (t["ttft_ms"] or 0)) / 1000
            if n > 8 and decode_s > 0:
                rates.append((n - 1) / decode_s)
        row["decode_tok_s"] = round(sum(rates) / len(rates), 1) if rates else None
        if profile != "chat":
            ws = tmp / "ws"
            ws.mkdir()
            (ws / "hello.txt").write_text(f"the secret word is {SECRET}\n")
            try:
                out = openclaw.run(["agent", "exec", "--config", str(cfg_path), "--cwd", str(ws), "--json",
                                    "What does hello.txt say? Use the read tool."], home, cfg_path)
                tools = out.get("toolSummary") or {}
                row["read_call"] = "read" in (tools.get("tools") or []) and not tools.get("failures")
                row["read_answer_right"] = SECRET in json.dumps(out.get("final", "")).lower()
            except AssertionError as e:
                row["read_call"], row["read_error"] = False, str(e)[-300:]
    finally:
        stop(proc)
    row["load_avg"] = round(os.getloadavg()[0], 1)
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", nargs="+", default=["qwen2.5-coder-1.5b:lean"], help="MODEL:PROFILE ...")
    ap.add_argument("--engine", default="vllm", choices=["vllm", "embedded"])
    ap.add_argument("--quantization", default="auto", choices=["auto", "none", "w4a16"],
                    help="clawproxy start --quantization")
    ap.add_argument("--out", default=None, help="append each row as a JSON line to this file")
    args = ap.parse_args(argv)
    from tests.openclaw_client import ensure_openclaw

    openclaw = ensure_openclaw()
    rows = []
    for pair in args.pairs:
        model, _, profile = pair.partition(":")
        row = run_pair(model, profile or "lean", args.engine, openclaw, args.quantization)
        print(json.dumps(row), flush=True)
        rows.append(row)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return rows


if __name__ == "__main__":
    main()
