"""Which dtype to serve a model in on vLLM CPU: decode speed, TTFT, and how far the served log-probs
are from the float32 trainer's (what the PPO ratio of the recorded behaviour log-probs sees).

Starts the engine as `clawproxy start` does (`python -m clawproxy.engine --kind vllm`) in the given
dtype, streams two greedy answers (a short and a ~400-token prompt, 64 tokens each, ignore_eos)
with log-probs, stops it, then scores the same tokens with a transformers float32 forward pass.

    .venv/bin/python bench/serve_dtype.py --model qwen2.5-coder-1.5b --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

from _env import ROOT, reserve_port
from engine import decode_rate, stream_body


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from clawproxy.engine.model import resolve_model
    from clawproxy.httpjson import answers_ok

    port = reserve_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="bench-dtype-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "clawproxy.engine", "--kind", "vllm", "--model", args.model,
                             "--dtype", args.dtype, "--port", str(port), "--max-model-len", "8192",
                             "--data-dir", tempfile.mkdtemp(prefix="bench-dtype-")],
                            stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    t0 = time.monotonic()
    try:
        while not answers_ok(url + "/health"):
            if proc.poll() is not None:
                raise SystemExit(f"vLLM exited; see {log.name}")
            time.sleep(1)
        ready = time.monotonic() - t0
        para = "The quick brown fox jumps over the lazy dog while the river flows past old stone bridges. " * 20
        stream_body(url, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})  # warm-up
        rows = []
        for content in ("Explain what a hash table is.", para + " Summarize this text."):
            body = {"messages": [{"role": "user", "content": content}], "max_tokens": args.tokens,
                    "temperature": 0, "ignore_eos": True, "logprobs": True}
            res = stream_body(url, body)
            rows.append({"prompt_tokens": res["prompt_tokens"], "ttft_s": round(res["ttft"], 2),
                         "decode_tok_s": round(decode_rate(res), 1)})
        last = stream_body(url, {**body, "stream_options": {"include_usage": True}})
    finally:
        proc.terminate()
        proc.wait(60)
    model = AutoModelForCausalLM.from_pretrained(str(resolve_model(args.model)), dtype=torch.float32)
    prompt, ids, served = last["prompt_token_ids"], last["token_ids"], last["logprobs"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    ref = torch.log_softmax(logits, -1)
    gaps = [abs(float(ref[i, t]) - lp) for i, (t, lp) in enumerate(zip(ids, served, strict=True))]
    print(json.dumps({"model": args.model, "dtype": args.dtype, "ready_s": round(ready, 1), "requests": rows,
                      "logprob_gap_vs_fp32": {"tokens": len(gaps), "max": round(max(gaps), 4),
                                              "mean": round(sum(gaps) / len(gaps), 4)}}))


if __name__ == "__main__":
    main()
