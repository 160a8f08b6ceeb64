"""bfloat16, float32 and 4-bit weights (``engine.quantization: w4a16``) on vLLM CPU, in one run.

Each round starts vLLM with the flags `clawproxy start` gives it (LoRA on) in each mode, the order
alternating (ABBA) so that other jobs on a shared machine load both alike, and measures:
- the answer to "capital of France" (greedy);
- decode tok/s of a greedy ``--tokens``-token answer to a short prompt (ignore_eos), and the same
  per CPU-second of vLLM's worker (what an idle core would give: time-sharing on a shared machine
  drops wall tok/s, not this; memory-bus contention drops both);
- TTFT of ~400- and ~1.8k-token prompts (fresh server: no prefix cache hit);
- a LoRA adapter (random, rank 8 on q/v) loaded through ``/v1/load_lora_adapter`` and answering
  with other log-probs than the base;
- peak RSS of vLLM's processes together (sampled every 0.5 s).

Bounds (``bench/bandwidth.py``, measured at the start and the end of the run): decode against read
bandwidth / bytes read per token (every weight but the embedding table, in its served dtype);
prefill against the GEMM FLOP/s of the mode's linear layers (bfloat16 as vLLM runs it, float32; PyTorch's
int4 kernel, which serves 4 bits on CPUs without AVX-512) / (2 x those weights' parameters).
``--logprob-gap``: the served log-probs of the 400-token answer against a float32 transformers
forward pass of the unquantized model (the trainer's), per mode.
``--answers``: the learning benchmark's base answers (``clawproxy simulate``'s measurement at 0
interactions: greedy, 160 tokens, the held-out prompts) graded by its real-answer checks: mean
words, cut-off, degenerate and off-topic shares, each preference's adoption; and greedy answers to
``bench/openclaw_models.py``'s five factual questions, checked by its patterns.

    .venv/bin/python bench/quant_serving.py --rounds 2 [--modes bf16,fp32,w4a16] --out bench/results/issue37-serving.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _env import ROOT
from _stream import decode_rate, stream_body
from bandwidth import measure
from openclaw_models import QUESTIONS

# mode -> (engine.dtype, engine.quantization); w4a16 keeps bfloat16 activations
MODES = {"bf16": ("bfloat16", "none"), "fp32": ("float32", "none"), "w4a16": ("bfloat16", "w4a16")}
FILLER = ("Our team keeps a log of every build, every failed test and every fix, and reads it each "
          "Monday to decide what to work on next. ")


def serving_bytes(model_dir: Path, float_bytes: int = 2) -> tuple[int, int]:
    """(bytes read per decoded token, parameters multiplied per prompt token) of a served checkpoint:
    every tensor but the embedding table (one row of it is read), floats in ``float_bytes`` (the serving
    dtype), packed integers as stored; the parameters of the layers' matrices but the output head
    (a prefill computes it for the last token only). Read from the safetensors headers."""
    import struct

    size = {"F32": float_bytes, "BF16": float_bytes, "F16": float_bytes, "I32": 4, "I64": 8, "U8": 1, "I8": 1}
    total = params = 0
    for f in model_dir.glob("*.safetensors"):
        with open(f, "rb") as fh:
            header = json.loads(fh.read(struct.unpack("<Q", fh.read(8))[0]))
        for name, t in header.items():
            if name == "__metadata__" or "embed_tokens" in name or name.endswith("weight_shape"):
                continue
            n = 1
            for d in t["shape"]:
                n *= d
            total += n * size[t["dtype"]]
            if name.endswith(("weight", "weight_packed")) and len(t["shape"]) == 2 and "lm_head" not in name:
                params += n * (8 if name.endswith("weight_packed") else 1)  # 8 int4 values per int32
    return total, params


def prompt_of(tokenizer: Any, tokens: int, tag: str) -> str:
    """A user message whose chat-rendered prompt is about ``tokens`` tokens long."""
    words = (f"[{tag}] " + FILLER * (tokens // 20 + 2)).split(" ")
    lo, hi = 1, len(words)
    while lo < hi:  # the longest prefix of words that fits
        mid = (lo + hi + 1) // 2
        text = " ".join(words[:mid]) + "\nSummarize the log in one line."
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        n = len(tokenizer(rendered, add_special_tokens=False)["input_ids"])
        lo, hi = (mid, hi) if n <= tokens else (lo, mid - 1)
    return " ".join(words[:lo]) + "\nSummarize the log in one line."


def make_adapter(base: Path, out: Path) -> Path:
    """A random rank-8 LoRA adapter on q_proj/v_proj of ``base`` (PEFT), nonzero B so it changes answers."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False))
    peft_model.save_pretrained(out)
    return out


class Server:
    """vLLM with the argv and environment `clawproxy start` gives it (``server_command``), on the
    served directory of one mode, its OpenMP threads bound to ``cpus``; its process tree's peak RSS
    sampled."""

    def __init__(self, model_dir: Path, port: int, cpus: str, mode: str):
        from clawproxy.config import load_config
        from clawproxy.engine.vllm.launch import server_command

        cfg = load_config(None, {"engine.port": port, "engine.max_model_len": 4096, "engine.kv_cache_gb": 2,
                                 "engine.dtype": MODES[mode][0], "engine.quantization": MODES[mode][1]})
        argv, env = server_command(cfg.engine, cfg.trainer, str(model_dir))
        # vLLM's auto binding puts every server on this machine on CPU 0; ours takes the one given
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
        # a 1.8k-token prefill in bfloat16 takes longer than vLLM's 300 s limit for one model step on
        # an AVX2 CPU (vLLM then stops the engine)
        env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] = "3600"
        self.url = f"http://127.0.0.1:{port}"
        self.served_name = cfg.engine.served_name
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-quant-{model_dir.name}-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, **env})
        self.peak_rss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="rss-sampler", daemon=True)
        self._sampler.start()

    def _tree(self) -> list[Any]:
        import psutil

        try:
            p = psutil.Process(self.proc.pid)
            return [p, *p.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _sample(self) -> None:
        import psutil

        while not self._stop.wait(0.5):
            rss = 0
            for p in self._tree():
                try:
                    rss += p.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            self.peak_rss = max(self.peak_rss, rss)

    def worker_cpu(self) -> float:
        """CPU seconds of vLLM's model worker (the process that runs the forward passes)."""
        for p in self._tree():
            if "Worker" in p.name() or any("Worker" in c for c in p.cmdline()[:1]):
                t = p.cpu_times()
                return t.user + t.system
        raise RuntimeError("no VLLM::Worker process")

    def wait_ready(self, timeout: float = 900) -> float:
        from clawproxy.httpjson import answers_ok

        t0 = time.monotonic()
        while not answers_ok(self.url + "/health"):
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout:
                raise SystemExit(f"vLLM did not start; see {self.log.name}")
            time.sleep(1)
        return time.monotonic() - t0

    def stop(self) -> None:
        self._stop.set()
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def chat(content: str, tokens: int, **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": tokens, "temperature": 0,
            **extra}


def base_answers(url: str, model: str) -> dict[str, Any]:
    """The held-out base answers, graded as ``clawproxy simulate`` grades its point at 0."""
    import asyncio

    import aiohttp

    from clawproxy.simulate.driver import answer_heldout
    from clawproxy.simulate.measure import adoption_with, make_point, score_answers
    from clawproxy.simulate.personas import PREFERENCES
    from clawproxy.simulate.prompts import HELDOUT_PROMPTS

    async def ask() -> list[Any]:
        async with aiohttp.ClientSession() as http:
            return await answer_heldout(http, url, list(HELDOUT_PROMPTS), model=model)

    t0 = time.monotonic()
    comps = asyncio.run(ask())
    took = time.monotonic() - t0
    graded = score_answers(HELDOUT_PROMPTS, [c.text for c in comps], PREFERENCES["concise"].check,
                           cut_off=[c.finish_reason == "length" for c in comps])
    point = make_point(0, graded, None, took)
    facts = []
    for question, right in QUESTIONS:
        text = stream_body(url, {**chat(question, 64), "model": model})["message"]["content"]
        facts.append({"question": question, "right": bool(re.search(right, text.lower())), "answer": text})
    return {"facts_right": sum(f["right"] for f in facts), "facts": facts,
            "prompts": len(graded), "seconds": round(took, 1), "mean_words": round(point.mean_words, 1),
            "cut_off_share": round(point.cut_off_share, 3), "degenerate_share": round(point.degenerate_share, 3),
            "off_topic_share": round(point.off_topic_share, 3),
            "adoption": {name: round(adoption_with(graded, pref.check), 3) for name, pref in PREFERENCES.items()},
            "answers": [c.text for c in comps]}


def one_server(args: argparse.Namespace, mode: str, model_dir: Path, port: int, prompts: dict[str, str],
               adapter: Path | None) -> dict[str, Any]:
    from clawproxy.httpjson import request_json

    srv = Server(model_dir, port, args.cpus, mode)
    row: dict[str, Any] = {"mode": mode}
    try:
        row["ready_s"] = round(srv.wait_ready(), 1)
        stream_body(srv.url, chat("hi", 4))  # warm-up: vLLM's first request is slow
        ans = stream_body(srv.url, chat("What is the capital of France? Answer in one sentence.", 40))
        row["capital_answer"] = ans["message"]["content"]
        cpu0 = srv.worker_cpu()
        res = stream_body(srv.url, chat("Explain how a hash table works.", args.tokens, ignore_eos=True))
        cpu = srv.worker_cpu() - cpu0
        row["decode_tok_s"] = round(decode_rate(res), 2)
        row["decode_tok_per_cpu_s"] = round(len(res["token_ids"]) / cpu, 2)
        for name, text in prompts.items():
            cpu0 = srv.worker_cpu()
            res = stream_body(srv.url, chat(text, 16, ignore_eos=True, logprobs=True), cpu=srv.worker_cpu)
            row[f"ttft_{name}_s"] = round(res["ttft"], 2)
            row[f"ttft_{name}_cpu_s"] = round(res["ttft_cpu"], 2)
            row[f"prompt_{name}_tokens"] = res["prompt_tokens"]
            row[f"decode_{name}_tok_s"] = round(decode_rate(res), 2)
            row[f"served_{name}"] = {"prompt_token_ids": res["prompt_token_ids"], "token_ids": res["token_ids"],
                                     "logprobs": res["logprobs"]}
            row[f"cpu_{name}_s"] = round(srv.worker_cpu() - cpu0, 2)
        if args.answers:
            row["heldout_base"] = base_answers(srv.url, srv.served_name)
        if adapter is not None:
            t0 = time.monotonic()
            request_json("POST", srv.url + "/v1/load_lora_adapter",
                         {"lora_name": "probe", "lora_path": str(adapter)}, timeout=300)
            row["lora_load_s"] = round(time.monotonic() - t0, 2)
            base = stream_body(srv.url, chat("Name three colours.", 16, logprobs=True))
            lora = stream_body(srv.url, {**chat("Name three colours.", 16, logprobs=True), "model": "probe"})
            row["lora_changes_logprobs"] = (base["token_ids"] != lora["token_ids"]
                                            or max(abs(a - b) for a, b in zip(base["logprobs"], lora["logprobs"],
                                                                              strict=False)) > 1e-3)
    finally:
        srv.stop()
        row["peak_rss_gb"] = round(srv.peak_rss / 1e9, 2)
        row["log"] = srv.log.name
    return row


def logprob_gaps(base_dir: Path, rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """max / mean |served - float32 forward| over the recorded tokens of prompt ``name``, per mode."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    out: dict[str, Any] = {}
    for row in rows:
        rec = row.get(f"served_{name}")
        if rec is None or row["mode"] in out:
            continue
        prompt, ids, served = rec["prompt_token_ids"], rec["token_ids"], rec["logprobs"]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
        ref = torch.log_softmax(logits, -1)
        gaps = [abs(float(ref[i, t]) - lp) for i, (t, lp) in enumerate(zip(ids, served, strict=True))]
        out[row["mode"]] = {"tokens": len(gaps), "max": round(max(gaps), 4), "mean": round(statistics.mean(gaps), 4)}
    return out


def rows_modes(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["mode"] for r in rows))


def summarize(rows: list[dict[str, Any]], bounds: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for mode in rows_modes(rows):
        mine = [r for r in rows if r["mode"] == mode and "decode_tok_s" in r]
        if not mine:
            continue
        med = {k: statistics.median(r[k] for r in mine) for k in
               ("decode_tok_s", "decode_tok_per_cpu_s", "ttft_400_s", "ttft_1800_s", "peak_rss_gb")}
        b = bounds[mode]
        med["all_decode_tok_s"] = [r["decode_tok_s"] for r in mine]
        med["all_ttft_1800_s"] = [r["ttft_1800_s"] for r in mine]
        med["bytes_per_token_gb"] = round(b["bytes"] / 1e9, 3)
        med["decode_bound_tok_s"] = round(b["decode_bound"], 1)
        med["decode_fraction_of_bound"] = round(med["decode_tok_s"] / b["decode_bound"], 2)
        med["decode_per_cpu_s_fraction_of_bound"] = round(med["decode_tok_per_cpu_s"] / b["decode_bound"], 2)
        med["prefill_1800_tok_s"] = round(statistics.median(r["prompt_1800_tokens"] / r["ttft_1800_s"] for r in mine), 1)
        med["prefill_bound_tok_s"] = round(b["prefill_bound"], 1)
        summary[mode] = med
    for a, b in (("w4a16", "bf16"), ("fp32", "bf16"), ("w4a16", "fp32")):
        if a in summary and b in summary:
            q, r = summary[a], summary[b]
            summary[f"{a}_over_{b}"] = {
                "decode": round(q["decode_tok_s"] / r["decode_tok_s"], 2),
                "decode_per_cpu_s": round(q["decode_tok_per_cpu_s"] / r["decode_tok_per_cpu_s"], 2),
                "ttft_400": round(q["ttft_400_s"] / r["ttft_400_s"], 2),
                "ttft_1800": round(q["ttft_1800_s"] / r["ttft_1800_s"], 2),
            }
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64, help="decoded tokens of the decode measurement")
    ap.add_argument("--port", type=int, default=8210, help="each server gets the next port from here")
    ap.add_argument("--cpus", default="1", help="VLLM_CPU_OMP_THREADS_BIND of the servers (auto binds all to CPU 0)")
    ap.add_argument("--modes", default="bf16,w4a16", help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("--no-lora", action="store_true", help="skip the LoRA adapter check")
    ap.add_argument("--logprob-gap", action="store_true", help="score the 400-token answers with a float32 forward")
    ap.add_argument("--answers", action="store_true", help="grade the benchmark's held-out base answers")
    ap.add_argument("--out", default=None, help="write the figures here (JSON)")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes {args.modes}: use a comma-separated list of {', '.join(MODES)}")
    from transformers import AutoTokenizer

    from clawproxy.engine.model import resolve_model
    from clawproxy.engine.vllm.quantize import quantized_model

    args.data_dir = tempfile.mkdtemp(prefix="bench-quant-")
    base = Path(resolve_model(args.model))
    served = {m: quantized_model(base, args.data_dir, MODES[m][1]) if MODES[m][1] != "none" else base
              for m in modes}  # made once, before timing
    tokenizer = AutoTokenizer.from_pretrained(base)
    adapter = None if args.no_lora else make_adapter(base, Path(args.data_dir) / "adapter")
    threads = len(args.cpus.split(","))
    machine = [measure([threads], 1.0, 5)]
    rows: list[dict[str, Any]] = []
    port = args.port
    for r in range(args.rounds):
        prompts = {n: prompt_of(tokenizer, n, f"round {r}") for n in (400, 1800)}
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            row = one_server(args, mode, served[mode], port, prompts, adapter)
            row.update(round=r, load_avg=os.getloadavg())
            rows.append(row)
            port += 1
            print(json.dumps({k: v for k, v in row.items() if not k.startswith("served_")}
                             | ({"heldout_base": {k: v for k, v in row["heldout_base"].items()
                                                   if k not in ("answers", "facts")}}
                                if "heldout_base" in row else {})), flush=True)
    machine.append(measure([threads], 1.0, 5))
    read_bw = max(m["memory"][0]["read_gb_s"]["best"] for m in machine) * 1e9
    # what each mode's linear layers run
    gemm = {"bf16": "bfloat16_gflop_s", "fp32": "float32_gflop_s", "w4a16": "int4_torch_gflop_s"}
    bounds = {}
    for mode, d in served.items():
        nbytes, params = serving_bytes(d, 4 if mode == "fp32" else 2)
        flops = max(m["matmul"][0][gemm[mode]]["best"] for m in machine) * 1e9
        bounds[mode] = {"bytes": nbytes, "params": params, "decode_bound": read_bw / nbytes,
                        "prefill_bound": flops / (2 * params)}
    result = {"model": args.model, "cpus": args.cpus, "machine": machine, "bounds": bounds,
              "summary": summarize(rows, bounds), "rows": rows}
    if args.logprob_gap:
        result["logprob_gap_vs_fp32_trainer"] = logprob_gaps(base, rows, "400")
    print(json.dumps({k: result[k] for k in ("bounds", "summary")} | (
        {"logprob_gap": result["logprob_gap_vs_fp32_trainer"]} if args.logprob_gap else {}), indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
