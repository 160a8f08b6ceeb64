"""GPU check: training tokens/s and peak memory for full fine-tuning and LoRA on the Qwen3-4B
architecture, with no download and no internet: the model is built from a config written here
and initialised at random (the figures depend on the shapes, not on the weights).

    python bench/gpu_check.py                       # Qwen3-4B shapes on cuda, ~2-4 minutes
    python bench/gpu_check.py --tiny --device cpu   # a 2-layer model of the same family (tests)

Settings follow configs/gpu-1.yaml: bf16 weights, gradient checkpointing, AdamW, micro batch of
``--micro-batch`` sequences of ``--seq-len`` tokens; LoRA r=32 alpha=64 on all linear layers (PEFT).
``tokens/s`` = tokens of one optimizer step / (forward + backward + step time), the median of the
steps after ``--warmup``. Peak memory: ``torch.cuda.max_memory_allocated`` on CUDA, max RSS on CPU;
each mode runs in its own subprocess so its peak is its own. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

QWEN3_4B = dict(  # Qwen/Qwen3-4B config.json
    vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
)
TINY = dict(QWEN3_4B, vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)


def run_one(args: argparse.Namespace) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    config = Qwen3Config(**(TINY if args.tiny else QWEN3_4B))
    with device:
        model = Qwen3ForCausalLM(config).to(dtype)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    if args.one == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=32, lora_alpha=64, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    tokens = args.micro_batch * args.seq_len
    ids = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq_len), device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times[args.warmup:])
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"mode": args.one, "params": sum(p.numel() for p in model.parameters()),
            "trainable": sum(p.numel() for p in params), "tokens_per_step": tokens,
            "step_s": round(step_s, 4), "tokens_per_s": round(tokens / step_s, 1),
            "peak_memory_gib": round(peak / 2**30, 3), "loss_finite": bool(torch.isfinite(loss))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="2-layer model of the same family (CPU tests)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 4096; --tiny: 64)")
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--modes", default="full,lora")
    ap.add_argument("--one", choices=["full", "lora"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.seq_len = args.seq_len or (64 if args.tiny else 4096)
    if args.one:
        print(json.dumps(run_one(args)))
        return
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run on a GPU machine, or pass --tiny --device cpu")
    out = {"model": "Qwen3 (tiny)" if args.tiny else "Qwen3-4B shapes, random init", "device": args.device,
           "seq_len": args.seq_len, "micro_batch": args.micro_batch, "runs": []}
    for mode in args.modes.split(","):
        argv = [sys.executable, __file__, "--one", mode, "--device", args.device, "--seq-len", str(args.seq_len),
                "--micro-batch", str(args.micro_batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
        if args.tiny:
            argv.append("--tiny")
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            out["runs"].append({"mode": mode, "error": proc.stderr.strip().splitlines()[-1:]})
            continue
        out["runs"].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
