"""Benchmark the embedded engine: decode tokens/s and TTFT (one request, four concurrent), reload
latency, against plain transformers ``generate()`` on the same prompts.

    .venv/bin/python bench/engine.py                 # default model, float32
    .venv/bin/python bench/engine.py --dtype bfloat16 --tokens 64 --rounds 3
    .venv/bin/python bench/engine.py --openclaw      # OpenClaw-shaped prompts (below) only

The engine runs as a real subprocess and is measured over HTTP (streaming, ``ignore_eos`` so
every request decodes exactly ``--tokens`` tokens). The baseline runs in this process with the
same thread count, greedy, ``min_new_tokens == max_new_tokens``. Baseline and engine rounds
alternate so that load from other processes on a shared machine hits both alike; medians are
reported with the load average.

--openclaw: an OpenClaw-shaped conversation built from the recorded first request in
tests/fixtures/openclaw_samples.jsonl (its system prompt without the skills and workspace files,
the read/write/edit/exec/process tool schemas, trimmed to --prompt-tokens as the engine renders
it; then the user message and the transient internal-context message OpenClaw appends). It
measures, on one engine with the prefix cache: TTFT of turn 1 (cold), of turn 2 (turn 1's
messages up to the transient one + the answer + a new user message + a new transient one), of
turn 2 again with the prefix cache emptied, and decode tok/s at that context. Then, on two more
engines (prefix cache off), one with prefill chunking off and one with --prefill-chunk-tokens: a
short request decodes while the OpenClaw prompt is prefilled; its tok/s and longest token gap
during that prefill are printed side by side, with the long prompt's TTFT.

Reload latency: a perturbed full checkpoint is written to disk, then timed from the moment it is
complete on disk until (a) ``EngineClient.load_weights`` returns (pause keep, reload, reset prefix
cache, resume) and (b) a request answers with the new ``weight_version``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from _env import reserve_port

from clawproxy.engine.client import EngineClient
from clawproxy.httpjson import open_url, request_json

PROMPTS = [
    "Write a short story about a robot learning to paint.",
    "Explain how a bicycle stays upright.",
    "List some tips for a good night's sleep.",
    "What should I pack for a weekend hiking trip?",
]


def stream(url: str, prompt: str, tokens: int) -> dict:
    """One streamed request; return TTFT and the arrival time of every token."""
    return stream_body(url, {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
                             "temperature": 0, "ignore_eos": True})


def stream_body(url: str, body: dict, stop: threading.Event | None = None,
                cpu: Callable[[], float] | None = None) -> dict:
    """Stream a chat request; TTFT, token arrival times, the answer as an assistant message.
    ``stop`` set: hang up after the next token (a client going away). ``cpu``: the engine's CPU
    seconds, read at the start and at the first token (``ttft_cpu``)."""
    body = {**body, "return_token_ids": True, "stream": True}
    cpu0 = cpu() if cpu else 0.0
    ttft_cpu = None
    t0 = time.perf_counter()
    arrivals: list[float] = []
    version = None
    content, calls, prompt_ids, ids, logprobs = "", [], [], [], []
    with open_url("POST", url + "/v1/chat/completions", body, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            version = chunk.get("weight_version", version)
            prompt_ids = chunk.get("prompt_token_ids") or prompt_ids
            if not chunk["choices"]:
                continue
            choice = chunk["choices"][0]
            if choice.get("token_ids"):
                arrivals += [time.perf_counter()] * len(choice["token_ids"])
                ids += choice["token_ids"]
                logprobs += [e["logprob"] for e in (choice.get("logprobs") or {}).get("content") or []]
                if cpu and ttft_cpu is None:
                    ttft_cpu = cpu() - cpu0
            content += choice["delta"].get("content") or ""
            calls += choice["delta"].get("tool_calls") or []
            if stop is not None and stop.is_set():
                break
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
    return {"start": t0, "ttft": arrivals[0] - t0, "ttft_cpu": ttft_cpu, "arrivals": arrivals,
            "version": version,
            "message": message, "prompt_tokens": len(prompt_ids), "prompt_token_ids": prompt_ids,
            "token_ids": ids, "logprobs": logprobs}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process: with one engine thread, what its wall time would be
    on an idle core (the bench machine is shared, so wall times carry other jobs' load)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def health(url: str) -> dict:
    return request_json("GET", url + "/health", timeout=30)


@contextlib.contextmanager
def engine_process(root: Path, args, *extra: str) -> Iterator[tuple[str, Callable[[], float]]]:
    """The engine as a real subprocess; yields its URL once healthy, and its CPU-seconds reader."""
    port = reserve_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="bench-engine-", suffix=".log", delete=False)
    proc = subprocess.Popen(
        [sys.executable, "-m", "clawproxy.engine", "--kind", "embedded", "--model", str(root), "--port", str(port),
         "--dtype", args.dtype, "--threads", str(args.threads), "--log-level", "WARNING", *extra],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 180
        while not EngineClient(url).health():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"engine did not start; see {log.name}")
            time.sleep(0.3)
        stream(url, PROMPTS[0], 4)  # warm-up
        yield url, lambda: cpu_seconds(proc.pid)
    finally:
        proc.terminate()
        proc.wait(20)


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


FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "openclaw_samples.jsonl"
LEAN_TOOLS = ("read", "write", "edit", "exec", "process")
# Sections OpenClaw's lean profile leaves out (skills: [], contextInjection: "never").
LEAN_DROPS = ("## Skills", "## Skill Workshop", "## Workspace Files", "## Bootstrap Pending")


def openclaw_turns(tokenizer, prompt_tokens: int) -> tuple[dict, list[dict], list[dict]]:
    """(turn-1 body, its messages before the transient one, the transient message).

    The recorded system prompt, lean, its sections kept in order as long as the rendered prompt
    stays within ``prompt_tokens``."""
    import re

    from clawproxy.chat_template import render_chat

    first = next(json.loads(line)["body"] for line in FIXTURE.open()
                 if json.loads(line)["label"].startswith("main-turn-1"))
    system, user, transient = first["messages"]
    tools = [t for t in first["tools"] if t["function"]["name"] in LEAN_TOOLS]
    sections = [p for p in re.split(r"(?m)^(?=## )", system["content"])]
    drop = False
    kept: list[str] = []
    for sec in sections:
        if sec.startswith("## "):  # a dropped section runs until the next kept heading
            drop = sec.startswith(LEAN_DROPS) or (drop and not sec.startswith("## Temporal Context"))
        if drop:
            continue
        msgs = [{"role": "system", "content": "".join([*kept, sec])}, user, transient]
        n = len(tokenizer(render_chat(tokenizer, msgs, tools, tools_as_text=True), add_special_tokens=False)["input_ids"])
        if n > prompt_tokens:
            continue  # a later, shorter section may still fit
        kept.append(sec)
    history = [{"role": "system", "content": "".join(kept)}, user]
    return {"messages": [*history, transient], "tools": tools}, history, transient


def openclaw_bench(url: str, cpu: Callable[[], float], tokenizer, args) -> dict:
    """Turn 1 cold, turn 2 on the prefix cache, turn 2 without it, decode tok/s at ~3k context."""
    body, history, transient = openclaw_turns(tokenizer, args.prompt_tokens)
    common = {"temperature": 0, "max_tokens": args.answer_tokens}
    EngineClient(url).reset_prefix_cache()
    t1 = stream_body(url, {**body, **common}, cpu=cpu)
    stamp = history[1]["content"].split("]", 1)[0] + "]"  # OpenClaw's "[Sun 2026-11-29 23:01 UTC]"
    user2 = {"role": "user", "content": f"{stamp} second turn please"}
    turn2 = {"messages": [*history, t1["message"], user2, transient], "tools": body["tools"]}
    fixed = {"temperature": 0, "max_tokens": args.tokens, "ignore_eos": True}
    before = health(url)
    cpu_t2_start = cpu()
    t2 = stream_body(url, {**turn2, **fixed}, cpu=cpu)
    cpu_t2_end = cpu()
    after = health(url)
    EngineClient(url).reset_prefix_cache()
    t2_cold = stream_body(url, {**turn2, "temperature": 0, "max_tokens": 1}, cpu=cpu)
    return {
        "openclaw_turn1_prompt_tokens": t1["prompt_tokens"],
        "openclaw_turn1_ttft_s": t1["ttft"],
        "openclaw_turn1_ttft_cpu_s": t1["ttft_cpu"],
        "openclaw_turn1_answer_tokens": len(t1["arrivals"]),
        "openclaw_turn2_prompt_tokens": t2["prompt_tokens"],
        "openclaw_turn2_reused_tokens": after["prefix_tokens_reused"] - before["prefix_tokens_reused"],
        "openclaw_turn2_ttft_s": t2["ttft"],
        "openclaw_turn2_ttft_cpu_s": t2["ttft_cpu"],
        "openclaw_turn2_ttft_no_prefix_cache_s": t2_cold["ttft"],
        "openclaw_turn2_ttft_no_prefix_cache_cpu_s": t2_cold["ttft_cpu"],
        "openclaw_decode_tok_s": decode_rate(t2),
        "openclaw_decode_cpu_s_per_token":
            (cpu_t2_end - cpu_t2_start - t2["ttft_cpu"]) / (len(t2["arrivals"]) - 1),
    }


def prefill_interference(url: str, cpu: Callable[[], float], tokenizer, args) -> dict:
    """A short request decodes; the OpenClaw prompt arrives: how does the short one fare?"""
    body, _, _ = openclaw_turns(tokenizer, args.prompt_tokens)
    stop = threading.Event()
    runner: dict = {}

    def run() -> None:
        runner.update(stream_body(url, {"messages": [{"role": "user", "content": PROMPTS[0]}],
                                        "max_tokens": 4000, "temperature": 0, "ignore_eos": True}, stop))

    th = threading.Thread(target=run)
    th.start()
    time.sleep(3.0)  # running, past its own prefill
    long = stream_body(url, {**body, "temperature": 0, "max_tokens": 1}, cpu=cpu)
    stop.set()
    th.join()
    t0, t1 = long["start"], long["start"] + long["ttft"]
    during = [a for a in runner["arrivals"] if t0 <= a <= t1]
    gaps = [b - a for a, b in zip([t0, *during], [*during, t1], strict=True)]
    return {"tok_s": len(during) / (t1 - t0), "max_gap_s": max(gaps), "long_ttft_s": long["ttft"],
            "long_ttft_cpu_s": long["ttft_cpu"],
            "tok_s_before": decode_rate({"arrivals": [a for a in runner["arrivals"] if a < t0]})}


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
    ap.add_argument("--openclaw", action="store_true",
                    help="only the OpenClaw-shaped measurements (TTFT per turn, chunked prefill)")
    ap.add_argument("--prompt-tokens", type=int, default=2900,
                    help="size of the OpenClaw-shaped first prompt (the lean profile's is ~2.9k)")
    ap.add_argument("--answer-tokens", type=int, default=64, help="cap on turn 1's answer")
    ap.add_argument("--chunk", type=int, default=None,
                    help="--prefill-chunk-tokens for the chunked side (default: the engine's)")
    args = ap.parse_args()

    import torch

    from clawproxy.engine.core import default_threads
    from clawproxy.engine.model import load_model_and_tokenizer, resolve_model

    args.threads = args.threads or default_threads()

    torch.set_num_threads(args.threads)
    root = Path(resolve_model(args.model, args.data_dir))
    if args.openclaw:
        return openclaw_main(root, args)
    model, tokenizer = load_model_and_tokenizer(str(root), args.data_dir, "float32", "cpu")

    # Rounds repeat prompts: without the prefix cache off, TTFT would measure cache hits.
    with engine_process(root, args, "--prefix-cache-mb", "0") as (url, _):
        client = EngineClient(url)
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


def openclaw_main(root: Path, args) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(root))
    with engine_process(root, args) as (url, cpu):
        fig = openclaw_bench(url, cpu, tokenizer, args)
    side = {}
    chunk = ["--prefill-chunk-tokens", str(args.chunk)] if args.chunk is not None else []
    for name, extra in (("unchunked", ["--prefill-chunk-tokens", "0"]), ("chunked", chunk)):
        with engine_process(root, args, "--prefix-cache-mb", "0", *extra) as (url, cpu):
            side[name] = prefill_interference(url, cpu, tokenizer, args)
    from clawproxy.config import EngineConfig

    fig.update({"model": root.name, "dtype": args.dtype, "threads": args.threads,
                "chunk_tokens": args.chunk if args.chunk is not None else EngineConfig().prefill_chunk_tokens,
                "load_avg_1m": os.getloadavg()[0],
                **{f"{k}_{name}": v for name, d in side.items() for k, v in d.items()}})
    print(f"model {fig['model']} ({args.dtype}), {args.threads} threads, load average {fig['load_avg_1m']:.1f}")
    print("  (wall seconds; in brackets the engine's CPU seconds, its wall time on an idle core)")
    print(f"  turn 1: {fig['openclaw_turn1_prompt_tokens']} prompt tokens, TTFT "
          f"{fig['openclaw_turn1_ttft_s']:.2f} s [{fig['openclaw_turn1_ttft_cpu_s']:.2f}] (cold), "
          f"answer {fig['openclaw_turn1_answer_tokens']} tokens")
    print(f"  turn 2: {fig['openclaw_turn2_prompt_tokens']} prompt tokens, "
          f"{fig['openclaw_turn2_reused_tokens']} from the prefix cache, TTFT "
          f"{fig['openclaw_turn2_ttft_s']:.2f} s [{fig['openclaw_turn2_ttft_cpu_s']:.2f}] "
          f"({fig['openclaw_turn2_ttft_no_prefix_cache_s']:.2f} s "
          f"[{fig['openclaw_turn2_ttft_no_prefix_cache_cpu_s']:.2f}] with the prefix cache emptied)")
    print(f"  decode at turn 2's context: {fig['openclaw_decode_tok_s']:.1f} tok/s "
          f"[{1 / fig['openclaw_decode_cpu_s_per_token']:.1f}]")
    print(f"  a running stream while turn 1's prompt prefills (chunk {fig['chunk_tokens']}):")
    for name in side:
        d = side[name]
        print(f"    {name:10s} {d['tok_s']:5.2f} tok/s (was {d['tok_s_before']:.1f}), longest gap "
              f"{d['max_gap_s']:5.2f} s; the long prompt's TTFT {d['long_ttft_s']:.2f} s "
              f"[{d['long_ttft_cpu_s']:.2f}]")
    if args.json:
        print(json.dumps(fig))


if __name__ == "__main__":
    main()
