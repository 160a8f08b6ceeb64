"""Benchmark the embedded engine: decode tokens/s and TTFT (one request, four concurrent), reload
latency, against plain transformers ``generate()`` on the same prompts.

    .venv/bin/python bench/engine.py                 # default model, float32
    .venv/bin/python bench/engine.py --dtype bfloat16 --tokens 64 --rounds 3

The engine runs as a real subprocess and is measured over HTTP (streaming, ``ignore_eos`` so
every request decodes exactly ``--tokens`` tokens). The baseline runs in this process with the
same thread count, greedy, ``min_new_tokens == max_new_tokens``. Baseline and engine rounds
alternate so that load from other processes on a shared machine hits both alike; medians are
reported with the load average.

Reload latency: a perturbed full checkpoint is written to disk, then timed from the moment it is
complete on disk until (a) ``EngineClient.load_weights`` returns (pause keep, reload, reset prefix
cache, resume) and (b) a request answers with the new ``weight_version``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from _env import reserve_port

from clawproxy.engine.client import EngineClient

PROMPTS = [
    "Write a short story about a robot learning to paint.",
    "Explain how a bicycle stays upright.",
    "List some tips for a good night's sleep.",
    "What should I pack for a weekend hiking trip?",
]


def stream(url: str, prompt: str, tokens: int) -> dict:
    """One streamed request; return TTFT and the arrival time of every token."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True, "stream": True}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    t0 = time.perf_counter()
    arrivals: list[float] = []
    version = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            version = chunk.get("weight_version", version)
            if chunk["choices"] and chunk["choices"][0].get("token_ids"):
                arrivals += [time.perf_counter()] * len(chunk["choices"][0]["token_ids"])
    return {"start": t0, "ttft": arrivals[0] - t0, "arrivals": arrivals, "version": version}


def decode_rate(res: dict) -> float:
    a = res["arrivals"]
    return (len(a) - 1) / (a[-1] - a[0])


def concurrent(url: str, tokens: int, n: int = 4) -> dict:
    results: list[dict] = [{}] * n

    def run(i: int) -> None:
        results[i] = stream(url, PROMPTS[i % len(PROMPTS)], tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start = min(r["start"] for r in results)
    end = max(r["arrivals"][-1] for r in results)
    total = sum(len(r["arrivals"]) for r in results)
    return {
        "aggregate_tok_s": total / (end - start),
        "per_request_tok_s": statistics.mean(decode_rate(r) for r in results),
        "ttft_mean": statistics.mean(r["ttft"] for r in results),
        "ttft_max": max(r["ttft"] for r in results),
    }


def baseline(model, tokenizer, prompt: str, tokens: int) -> dict:
    """Plain transformers generate(), greedy, exactly ``tokens`` new tokens."""
    import torch

    inputs = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                           add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    with torch.inference_mode():
        t0 = time.perf_counter()
        model.generate(**inputs, max_new_tokens=1, do_sample=False)
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        model.generate(**inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
        dt = time.perf_counter() - t0
    return {"tok_s": tokens / dt, "ttft": ttft}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--data-dir", default=None, help="model cache dir (default: the shared cache)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for engine and baseline (default: the engine's default)")
    ap.add_argument("--reloads", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = ap.parse_args()

    import torch

    from clawproxy.engine.core import default_threads
    from clawproxy.engine.model import load_model_and_tokenizer, resolve_model

    args.threads = args.threads or default_threads()

    torch.set_num_threads(args.threads)
    root = Path(resolve_model(args.model, args.data_dir))
    model, tokenizer = load_model_and_tokenizer(str(root), args.data_dir, "float32", "cpu")

    port = reserve_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="bench-engine-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "clawproxy.engine", "--model", str(root), "--port", str(port),
         "--dtype", args.dtype, "--threads", str(args.threads), "--log-level", "WARNING",
         # Rounds repeat prompts: without this, TTFT would measure prefix-cache hits.
         "--prefix-cache-entries", "0"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    client = EngineClient(url)
    try:
        deadline = time.monotonic() + 180
        while not client.health():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"engine did not start; see {log.name}")
            time.sleep(0.3)
        stream(url, PROMPTS[0], 4)  # warm-up
        baseline(model, tokenizer, PROMPTS[0], 4)

        base, single, multi = [], [], []
        for r in range(args.rounds):
            prompt = PROMPTS[r % len(PROMPTS)]
            base.append(baseline(model, tokenizer, prompt, args.tokens))
            single.append(stream(url, prompt, args.tokens))
            multi.append(concurrent(url, args.tokens))
            print(f"round {r + 1}: generate {base[-1]['tok_s']:.1f} tok/s | engine x1 "
                  f"{decode_rate(single[-1]):.1f} tok/s | engine x4 {multi[-1]['aggregate_tok_s']:.1f} "
                  f"tok/s aggregate", flush=True)

        reload_call, reload_serving = [], []
        version = client.weight_version()
        with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
            for i in range(args.reloads):
                ckpt = Path(tmp) / f"v{i}"
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1.0 + 1e-3 * (1 if i % 2 == 0 else -1))
                model.save_pretrained(ckpt, safe_serialization=True)
                tokenizer.save_pretrained(ckpt)
                version += 1
                t0 = time.perf_counter()
                client.load_weights(str(ckpt), version)
                t1 = time.perf_counter()
                res = stream(url, PROMPTS[0], 1)
                assert res["version"] == version, res
                reload_call.append(t1 - t0)
                reload_serving.append(res["start"] + res["ttft"] - t0)
    finally:
        proc.terminate()
        proc.wait(20)

    med = statistics.median
    base_rate = med(b["tok_s"] for b in base)
    figures = {
        "model": str(root.name),
        "dtype": args.dtype,
        "threads": args.threads,
        "tokens": args.tokens,
        "load_avg_1m": os.getloadavg()[0],
        "generate_tok_s": base_rate,
        "generate_ttft_s": med(b["ttft"] for b in base),
        "engine_x1_tok_s": med(decode_rate(s) for s in single),
        "engine_x1_ttft_s": med(s["ttft"] for s in single),
        "engine_x4_aggregate_tok_s": med(m["aggregate_tok_s"] for m in multi),
        "engine_x4_per_request_tok_s": med(m["per_request_tok_s"] for m in multi),
        "engine_x4_ttft_mean_s": med(m["ttft_mean"] for m in multi),
        "reload_call_s": med(reload_call),
        "reload_to_serving_s": med(reload_serving),
    }
    print()
    print(f"model {figures['model']} ({args.dtype}), {args.threads} threads, {args.tokens} tokens, "
          f"{args.rounds} rounds, load average {figures['load_avg_1m']:.1f}")
    print(f"  plain generate():        {base_rate:6.1f} tok/s   TTFT {figures['generate_ttft_s']:.3f} s")
    print(f"  engine, 1 request:       {figures['engine_x1_tok_s']:6.1f} tok/s   TTFT "
          f"{figures['engine_x1_ttft_s']:.3f} s   ({figures['engine_x1_tok_s'] / base_rate:.2f}x generate)")
    print(f"  engine, 4 concurrent:    {figures['engine_x4_aggregate_tok_s']:6.1f} tok/s aggregate "
          f"({figures['engine_x4_aggregate_tok_s'] / base_rate:.2f}x), "
          f"{figures['engine_x4_per_request_tok_s']:.1f} tok/s per request, "
          f"TTFT mean {figures['engine_x4_ttft_mean_s']:.3f} s")
    print(f"  reload: load_weights {figures['reload_call_s']:.2f} s, checkpoint on disk -> first "
          f"token from new weights {figures['reload_to_serving_s']:.2f} s")
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
