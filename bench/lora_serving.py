"""What serving N users' adapters costs against one: TTFT, decode rate and memory on the real vLLM.

Makes N LoRA adapters of the served model (PEFT, the trainer's rank and targets, random B so each
one changes the answers), loads them into a running vLLM under the names the proxy routes users to
(``clawproxy-u-<name>``), then times the same concurrent load three ways: every request to the base
model, every request to one adapter, and request i to adapter i % N. Memory is the vLLM process
tree's resident set after each condition.

Start the vLLM as clawproxy does, with LoRA on and room for N adapters, e.g. a config holding
``engine: {model: qwen2.5-coder-1.5b, port: 8100, max_loras: 4}`` and ``trainer: {finetune: lora}``:

    .venv/bin/python -m clawproxy.engine --config FILE &
    .venv/bin/python bench/lora_serving.py --engine-url http://127.0.0.1:8100 --model qwen2.5-coder-1.5b \\
        --adapters 3 --concurrency 3 --rounds 3

Figures: bench/results/lora-serving.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from _env import ROOT  # noqa: F401  (sets up the environment)
from _stream import stream_body
from judge_candidates import engine_process

from clawproxy.engine.client import EngineClient
from clawproxy.engine.model import resolve_model
from clawproxy.users import adapter_name

_ids = itertools.count()
PROMPT = ("Explain, step by step, how a hash map handles collisions, and when you would pick open "
          "addressing over separate chaining. ") * 8


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine-url", required=True)
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="The served name (and catalog name).")
    p.add_argument("--adapters", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--tokens", type=int, default=48, help="Tokens decoded per request (ignore_eos).")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--probe-only", action="store_true", help="Only check that base answers stay the base's.")
    p.add_argument("--out", default=None)
    return p.parse_args()


def make_adapters(model_dir: Path, n: int, r: int, out: Path) -> list[Path]:
    """``n`` PEFT adapters with random (non-zero) B, so each one really changes the answers."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    paths = []
    for i in range(n):
        torch.manual_seed(i)
        cfg = LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", init_lora_weights=False)
        peft = get_peft_model(base, cfg)
        with torch.no_grad():  # a delta that changes greedy answers, as a trained adapter does
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.mul_(0.1)
        path = out / f"user{i}"
        peft.save_pretrained(path)
        base = peft.unload()
        paths.append(path)
    return paths


def rss_gib(proc: psutil.Process | None) -> float:
    if proc is None:
        return float("nan")
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**30


def load(url: str, models: list[str], tokens: int) -> list[dict]:
    """One request per entry of ``models``, all at once; TTFT and decode rate of each."""
    def one(model: str) -> dict:
        # a fresh first line per request: no prefix-cache hit, every request prefills its prompt
        prompt = f"Request {next(_ids)}.\n{PROMPT}"
        res = stream_body(url, {"model": model, "messages": [{"role": "user", "content": prompt}],
                                "max_tokens": tokens, "temperature": 0, "ignore_eos": True})
        arr = res["arrivals"]
        return {"ttft": res["ttft"], "decode": (len(arr) - 1) / (arr[-1] - arr[0]) if len(arr) > 1 else 0.0}

    with ThreadPoolExecutor(len(models)) as pool:
        return list(pool.map(one, models))


def main() -> None:
    a = parse_args()
    url = a.engine_url.rstrip("/")
    proc = engine_process(url)
    client = EngineClient(url, kind="vllm")
    names = [adapter_name(f"user{i}") for i in range(a.adapters)]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        paths = make_adapters(Path(resolve_model(a.model)), a.adapters, a.lora_r, Path(tmp))
        print(f"made {a.adapters} adapters in {time.perf_counter() - t0:.0f} s "
              f"({sum(f.stat().st_size for p in paths for f in p.iterdir()) / a.adapters / 2**20:.0f} MiB each)")
        rss = {"before loading": rss_gib(proc)}
        loads = []
        for name, path in zip(names, paths, strict=True):
            t0 = time.perf_counter()
            EngineClient(url, kind="vllm", lora_name=name).load_adapter(str(path))
            loads.append(time.perf_counter() - t0)
        rss["adapters loaded"] = rss_gib(proc)
        conditions = {
            "base": [a.model] * a.concurrency,
            "one adapter": [names[0]] * a.concurrency,
            f"{a.adapters} adapters": [names[i % a.adapters] for i in range(a.concurrency)],
        }
        load(url, [a.model], 4)  # warm-up
        # a base request must answer the same alone and batched beside adapter requests
        probe = {"model": a.model, "messages": [{"role": "user", "content": "Name three prime numbers."}],
                 "max_tokens": 24, "temperature": 0}
        alone = stream_body(url, probe)["token_ids"]
        with ThreadPoolExecutor(len(names)) as pool:  # every adapter in a slot (--adapters = max_loras fills them)
            side = [pool.submit(stream_body, url, {**probe, "model": n, "max_tokens": 64}) for n in names]
            beside = stream_body(url, probe)["token_ids"]
            [f.result() for f in side]
        isolated = alone == beside
        differs = stream_body(url, {**probe, "model": names[-1]})["token_ids"] != alone  # else the probe proves nothing
        print(f"base answer beside adapter requests: {'unchanged' if isolated else 'CHANGED'} "
              f"(an adapter's own answer differs from the base's: {differs})", flush=True)
        if a.probe_only:
            return
        results: dict[str, dict] = {}
        for label, models in conditions.items():
            load(url, models, 4)  # each adapter in its slot before timing
            rows = [row for _ in range(a.rounds) for row in load(url, models, a.tokens)]
            results[label] = {"ttft_p50": statistics.median(r["ttft"] for r in rows),
                              "decode_p50": statistics.median(r["decode"] for r in rows),
                              "rss_gib": rss_gib(proc), "requests": len(rows)}
            print(f"{label:>12}: TTFT p50 {results[label]['ttft_p50']:.2f} s, decode p50 "
                  f"{results[label]['decode_p50']:.1f} tok/s per request, engine RSS "
                  f"{results[label]['rss_gib']:.2f} GiB ({len(rows)} requests, {a.concurrency} at a time)",
                  flush=True)
        print(f"load_lora_adapter: {', '.join(f'{s:.2f}' for s in loads)} s; RSS {rss}")
        print(f"served adapters: {sorted(client.served_adapters())}")
    if a.out:
        Path(a.out).write_text(json.dumps({"args": vars(a), "base_isolated": isolated, "loads_s": loads, "rss_gib": rss,
                                           "results": results}, indent=1))


if __name__ == "__main__":
    main()
