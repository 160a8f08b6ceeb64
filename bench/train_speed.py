"""Trainer benchmark: training tokens/s and peak memory, full and LoRA, against a plain PyTorch
loop on the same batch; and the time from "batch ready" to "new weights serving" in a live engine.

    .venv/bin/python bench/train_speed.py                 # default model (SmolLM2-135M), CPU
    .venv/bin/python bench/train_speed.py --steps 5 --no-engine
    .venv/bin/python bench/train_speed.py --model /path/to/hf-dir --device cuda

Each configuration runs in its own subprocess so peak memory (max RSS on CPU, max allocated on
CUDA) belongs to it alone. The batch: ``--batch-size`` judged turns of the model's own chat
template (prompt ~60 tokens) with ~``--completion-tokens`` recorded completion tokens; half carry a
hint (so the combined objective runs the teacher pass), scores alternate +1/-1.

Figures: ``tokens/s`` = (prompt + completion tokens of the batch) / (forward + backward +
optimizer step time), averaged over the steps after a warm-up step. The trainer's figure includes
its extra teacher forward for hinted samples; the baseline does one forward + backward + AdamW.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _env import ROOT

QUESTIONS = [
    "Explain what a hash table is.",
    "How do I undo my last git commit?",
    "Write a haiku about autumn.",
    "What causes the seasons on Earth?",
    "Summarize the plot of Hamlet.",
    "Give me three tips for better sleep.",
    "What is the difference between TCP and UDP?",
    "How does a bicycle stay upright?",
]
FILLER = (
    "Sure. The short answer is that it depends on the details, but here is the general idea. "
    "First, consider what you are trying to achieve and which constraints matter most. Second, "
    "pick the simplest approach that satisfies them, and measure before optimizing anything. "
    "Third, write down what you learned so the next person does not have to rediscover it. "
    "If you want, I can walk through a concrete example step by step with code and numbers."
)


def _system_prompt(tokenizer, prompt_tokens: int | None) -> str:
    """A system prompt of about ``prompt_tokens`` tokens (an agent's long instructions stand-in)."""
    if not prompt_tokens:
        return "You are a helpful assistant."
    per = len(tokenizer.encode(FILLER, add_special_tokens=False))
    return "You are a helpful assistant.\n" + "\n".join([FILLER] * max(1, prompt_tokens // per))


def _insert_batch(store, tokenizer, n: int, completion_tokens: int, seed: int,
                  prompt_tokens: int | None = None) -> None:
    rng = random.Random(seed)
    filler = tokenizer.encode(FILLER, add_special_tokens=False)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    system = _system_prompt(tokenizer, prompt_tokens)
    for i in range(n):
        q = QUESTIONS[(seed * n + i) % len(QUESTIONS)]
        messages = [{"role": "system", "content": system}, {"role": "user", "content": q}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        start = rng.randrange(0, 10)
        completion = (filler * 4)[start : start + completion_tokens - 1] + [eos]
        turn_id = store.insert("turns", {
            "request_id": f"bench-{seed}-{i}-{time.time()}", "created_at": time.time(), "path": "/v1/chat/completions",
            "kind": "main", "status": "ok", "request_messages": messages,
            "prompt_token_ids": prompt, "completion_token_ids": completion,
            "completion_logprobs": [-2.0] * len(completion), "finish_reason": "stop",
            "weight_version": 0, "trainable": 1, "reason": "ok",
        })
        store.insert("judgments", {"turn_id": turn_id, "score": 1 if i % 2 == 0 else -1,
                                   "hint": "Keep answers under 40 words." if i % 2 == 0 else None,
                                   "voter": "bench", "created_at": time.time()})


def _peak_mb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_trainer(args: argparse.Namespace, finetune: str) -> dict:
    """The real Trainer: ``steps`` optimizer steps (+1 warm-up) without an engine."""
    from clawproxy.config import load_config
    from clawproxy.store import Store
    from trainer.loop import Trainer

    data = Path(tempfile.mkdtemp(prefix="bench-trainer-"))
    lr = 1e-4 if finetune == "lora" else 1e-5
    cfg = load_config(None, {"data_dir": str(data), "engine.model": args.model,
                             "trainer.finetune": finetune, "trainer.batch_size": args.batch_size,
                             "trainer.learning_rate": lr, "trainer.keep_checkpoints": 2,
                             "trainer.max_seq_len": max(4096, (args.prompt_tokens or 0) + 2 * args.completion_tokens),
                             "trainer.threads": args.threads,
                             "trainer.gradient_checkpointing": args.gradient_checkpointing,
                             "trainer.dtype": args.dtype})
    store = Store(cfg.db_path)
    trainer = Trainer(cfg, store)

    results = []
    for step in range(args.steps + 1):
        _insert_batch(store, trainer.policy.tokenizer, args.batch_size, args.completion_tokens, seed=step,
                      prompt_tokens=args.prompt_tokens)
        t0 = time.perf_counter()
        r = trainer.step(trainer.collect())
        results.append({**r.metrics, "wall_s": time.perf_counter() - t0})
    timed = results[1:]
    return {
        "mode": f"trainer {finetune} {args.dtype}",
        "tokens_per_step": timed[0]["tokens"],
        "tokens_per_s": sum(m["tokens"] for m in timed) / sum(m["train_s"] for m in timed),
        "step_s": sum(m["train_s"] for m in timed) / len(timed),
        "gate_and_save_s": sum(m["wall_s"] - m["train_s"] for m in timed) / len(timed),
        "peak_mb": _peak_mb(str(trainer.policy.accelerator.device)),
        "status": [r["gate"]["ok"] for r in timed],
    }


def run_baseline(args: argparse.Namespace) -> dict:
    """Plain PyTorch: forward + backward + AdamW on the same token sequences, one at a time."""
    import torch
    from transformers import AutoModelForCausalLM

    from clawproxy.engine.model import resolve_model
    from clawproxy.store import Store
    from trainer.policy import load_tokenizer

    base = Path(resolve_model(args.model))
    if args.threads:
        torch.set_num_threads(args.threads)
    tok = load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32).to(args.device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    store = Store(Path(tempfile.mkdtemp(prefix="bench-base-")) / "db")
    times, tokens = [], 0
    for step in range(args.steps + 1):
        _insert_batch(store, tok, args.batch_size, args.completion_tokens, seed=step,
                      prompt_tokens=args.prompt_tokens)
        rows = store.query("SELECT prompt_token_ids, completion_token_ids FROM turns ORDER BY id DESC LIMIT ?", (args.batch_size,))
        t0 = time.perf_counter()
        n = 0
        for r in rows:
            ids = torch.tensor([r["prompt_token_ids"] + r["completion_token_ids"]], device=args.device)
            labels = ids.clone()
            labels[:, : len(r["prompt_token_ids"])] = -100
            loss = model(input_ids=ids, labels=labels).loss / len(rows)
            loss.backward()
            n += ids.numel()
        opt.step()
        opt.zero_grad()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        if step > 0:
            times.append(time.perf_counter() - t0)
            tokens += n
    return {"mode": "plain PyTorch full", "tokens_per_step": n, "tokens_per_s": tokens / sum(times),
            "step_s": sum(times) / len(times), "peak_mb": _peak_mb(args.device)}


def run_engine_publish(args: argparse.Namespace) -> dict:
    """Batch ready -> new weights serving, with a real engine process on the same machine."""
    from clawproxy.config import load_config
    from clawproxy.engine.client import EngineClient
    from clawproxy.engine.model import resolve_model
    from clawproxy.store import Store
    from tests.rig.engine_proc import engine_process
    from trainer.loop import Trainer

    base = Path(resolve_model(args.model))
    data = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    threads = ["--threads", str(args.threads)] if args.threads else []
    with engine_process(base, data, *threads, timeout=180.0) as url:
        cfg = load_config(None, {"data_dir": str(data), "engine.model": args.model, "engine.kind": "embedded",
                                 "trainer.batch_size": args.batch_size, "trainer.keep_checkpoints": 2,
                                 "trainer.threads": args.threads})
        store = Store(cfg.db_path)
        engine = EngineClient(url)
        trainer = Trainer(cfg, store, engine)
        out = []
        for step in range(2):
            _insert_batch(store, trainer.policy.tokenizer, args.batch_size, args.completion_tokens, seed=100 + step)
            r = trainer.step(trainer.collect())
            assert r.status == "published", r.metrics.get("gate")
            assert engine.weight_version() == r.new_version
            out.append(r.metrics)
        m = out[-1]
        return {"mode": "batch ready -> serving (engine)", "batch_to_serving_s": m["batch_to_serving_s"],
                "train_s": m["train_s"], "save_and_reload_s": m["publish_s"],
                "gate_s": m["batch_to_serving_s"] - m["train_s"] - m["publish_s"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the trainer uses accelerate's device)")
    p.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--completion-tokens", type=int, default=100)
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help="pad the system prompt to about this many tokens (OpenClaw's are 3-10k)")
    p.add_argument("--no-engine", action="store_true", help="skip the batch-ready -> serving measurement")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads for trainer and baseline (and the engine); 1 on a busy shared CPU")
    p.add_argument("--modes", default="baseline,full,lora",
                   help="comma-separated, of baseline, full, lora (full fine-tuning of a 1.5B model in "
                        "float32 needs ~25 GB: --modes lora there)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="trainer.gradient_checkpointing")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="trainer.dtype (the trainer modes): bfloat16 needs a CPU with AVX512-BF16 or AMX to pay")
    p.add_argument("--one", choices=["full", "lora", "baseline", "engine"], help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.one:
        fn = {"full": lambda: run_trainer(args, "full"), "lora": lambda: run_trainer(args, "lora"),
              "baseline": lambda: run_baseline(args), "engine": lambda: run_engine_publish(args)}[args.one]
        print("RESULT " + json.dumps(fn()))
        return

    modes = args.modes.split(",") + ([] if args.no_engine else ["engine"])
    results = []
    for mode in modes:
        cmd = [sys.executable, __file__, "--one", mode, "--model", args.model, "--device", args.device,
               "--steps", str(args.steps), "--batch-size", str(args.batch_size),
               "--completion-tokens", str(args.completion_tokens), "--dtype", args.dtype] + (
                   ["--gradient-checkpointing"] if args.gradient_checkpointing else []) + (
                   ["--threads", str(args.threads)] if args.threads else []) + (
                   ["--prompt-tokens", str(args.prompt_tokens)] if args.prompt_tokens else [])
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            print(f"{mode}: failed\n{proc.stderr[-3000:]}")
            continue
        r = json.loads(line[0][len("RESULT "):])
        r["wall_s"] = time.time() - t0
        results.append(r)
        print(json.dumps(r))

    print(f"\nmodel={args.model} device={args.device} batch={args.batch_size} x ~{args.completion_tokens} "
          f"completion tokens, prompts ~{args.prompt_tokens or 60} tokens, {args.steps} timed steps, torch threads={args.threads or 'default'}, "
          f"cores={os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    print(f"{'mode':34} {'tokens/s':>9} {'step s':>8} {'gate+save s':>12} {'peak MB':>9}")
    for r in results:
        if "tokens_per_s" in r:
            print(f"{r['mode']:34} {r['tokens_per_s']:9.0f} {r['step_s']:8.2f} "
                  f"{r.get('gate_and_save_s', 0.0):12.1f} {r['peak_mb']:9.0f}")
    for r in results:
        if "batch_to_serving_s" in r:
            print(f"batch ready -> new weights serving: {r['batch_to_serving_s']:.1f} s "
                  f"(train {r['train_s']:.1f} s, gate {r['gate_s']:.1f} s, save + engine reload "
                  f"{r['save_and_reload_s']:.1f} s)")


if __name__ == "__main__":
    main()
