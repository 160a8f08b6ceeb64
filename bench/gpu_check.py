"""GPU check: the trainer's real ``train_step`` (tree packing, LoRA, the OPD teacher pass) on a model
of the default model's shape, with random weights, on OpenClaw-length samples, in bf16.

    python bench/gpu_check.py                            # Qwen2.5-Coder-1.5B shapes on cuda, ~1-3 min
    python bench/gpu_check.py --tiny --device cpu        # a 2-layer model of the same family (the test)

Nothing is downloaded: the model is built from the config below (Qwen2.5-Coder-1.5B-Instruct's
config.json) and initialised at random, since step time and memory depend on the shapes, not the
weights. The tokenizer is a byte-level BPE trained here on the recorded OpenClaw requests
(tests/fixtures/openclaw_samples.jsonl), with a ChatML template, so that prompts have about the
token count the real one gives; each sample is a recorded request rendered as the engine renders
it (``trainer.batch.prompt_ids``), a random completion, and for half of them the judge's hint, so
the teacher pass runs. The trainer's settings are configs/default.yaml's (combined method, LoRA,
gradient checkpointing, ``pack_prefixes``) with ``trainer.dtype: bfloat16``.

Needs torch, transformers, peft and accelerate, and what the trainer imports besides (trl, which
pulls in datasets; pydantic, pyyaml, orjson, rich for the config); no vLLM, no network. Prints one JSON object: the median step time after
``--warmup`` steps, peak memory (``torch.cuda.max_memory_allocated``; max RSS on CPU), tokens/s
(the batch's prompt + completion tokens over the step time), and the step's own figures.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _env import ROOT

QWEN25_CODER_1_5B = dict(  # Qwen/Qwen2.5-Coder-1.5B-Instruct config.json
    vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
    num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
    rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu",
)
TINY = dict(QWEN25_CODER_1_5B, vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)
SAMPLES = ROOT / "tests" / "fixtures" / "openclaw_samples.jsonl"
HINT = "Answer in under 40 words."
CHATML = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'system' and loop.first and tools %}{{ m.content }}\n\n# Tools\n<tools>"
    "{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n</tools>"
    "{%- elif m.content is string %}{{ m.content }}{%- endif %}"
    "{%- for c in m.tool_calls or [] %}\n<tool_call>\n{{ c.function | tojson }}\n</tool_call>{%- endfor %}"
    "<|im_end|>\n{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def requests() -> list[dict]:
    """The recorded OpenClaw chat requests that carry messages, each with the first request's
    system prompt and tool schemas (the fixture elides them in the later requests of a session)."""
    rows = [json.loads(line) for line in SAMPLES.read_text().splitlines() if line.strip()]
    bodies = [b for r in rows if r.get("path") == "/v1/chat/completions"
              if isinstance(b := r.get("body"), dict) and b.get("messages") and b.get("tools")]
    first = bodies[0]
    system, tools = first["messages"][0], first["tools"]
    return [{**b, "tools": tools, "messages": [system, *[m for m in b["messages"] if m["role"] != "system"]]}
            for b in bodies]


def session(tokenizer, prompt_tokens: int) -> list[dict]:
    """The requests as turns of one session: the system prompt cut so that the first has at most
    ``prompt_tokens`` tokens (the tool schemas alone are ~3.3k), shared by every turn, as tree
    packing finds it in a batch of one session's turns."""
    bodies = requests()
    system = bodies[0]["messages"][0]["content"]
    ids = tokenizer(system, add_special_tokens=False)["input_ids"]
    from trainer.batch import prompt_ids

    lo, hi = 0, len(ids)  # the longest cut whose first request stays within prompt_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        cut = [{**bodies[0], "messages": [{"role": "system", "content": tokenizer.decode(ids[:mid])},
                                          *bodies[0]["messages"][1:]]}]
        if len(prompt_ids(tokenizer, cut[0]["messages"], cut[0]["tools"], None, tools_as_text=False)) <= prompt_tokens:
            lo = mid
        else:
            hi = mid - 1
    head = {"role": "system", "content": tokenizer.decode(ids[:lo])}
    return [{**b, "messages": [head, *b["messages"][1:]]} for b in bodies]


def write_model(out: Path, shape: dict, vocab: int) -> Path:
    """A model dir: the shape's config, random weights in bf16, a BPE tokenizer trained on the samples."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    texts = [m["content"] for b in requests() for m in b["messages"] if isinstance(m.get("content"), str)]
    texts += [json.dumps(t) for t in requests()[0]["tools"]]
    bpe.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHATML
    tok.save_pretrained(out)
    config = Qwen2Config(**shape, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # random init on the GPU: seconds, not a minute
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    del model
    return out


def make_batch(tokenizer, prompt_tokens: int, completion_tokens: int, n: int, lr: float):
    """``n`` samples from the recorded requests: rl, rl_opd (hinted), opd (hinted) and rl in turn."""
    from clawproxy.engine_spec import engine_spec
    from trainer.batch import Sample, prompt_ids
    from trainer.loop import Batch

    tools_as_text = engine_spec("vllm").tools_as_text  # the default engine renders the prompts
    rng = random.Random(0)
    objectives = ["rl_opd", "rl", "opd", "rl"]
    bodies = session(tokenizer, prompt_tokens)
    samples = []
    for i in range(n):
        body, objective = bodies[i % len(bodies)], objectives[i % len(objectives)]
        params = {k: v for k, v in body.items() if k not in ("messages", "tools", "model", "stream")}
        prompt = prompt_ids(tokenizer, body["messages"], body.get("tools"), params, tools_as_text=tools_as_text)
        completion = [rng.randrange(3, len(tokenizer)) for _ in range(completion_tokens)]
        samples.append(Sample(
            turn_id=i + 1, prompt_ids=prompt, completion_ids=completion,
            behaviour_logps=[-rng.uniform(0.5, 3.0) for _ in completion], score=1 if i % 2 else -1,
            hint=HINT if objective != "rl" else None, weight_version=0, messages=body["messages"],
            tools=body.get("tools"), params=params, objective=objective, tools_as_text=tools_as_text,
        ))
    return Batch(serving=None, samples=samples, baselines={}, lr=lr, skipped={})  # type: ignore[arg-type]


def run(args: argparse.Namespace) -> dict:
    import torch
    from accelerate import Accelerator

    from clawproxy.config import load_config
    from trainer.checkpoints import Version
    from trainer.loop import Policy, train_step
    from trainer.policy import TEACHER_ADAPTER, Teacher, load_policy, load_tokenizer

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on a GPU machine, or pass --tiny --device cpu")
    t_setup = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    shape = TINY if args.tiny else QWEN25_CODER_1_5B
    base = write_model(scratch / "model", shape, vocab=min(8000, shape["vocab_size"]))
    cfg = load_config(ROOT / "configs" / "default.yaml", {
        "data_dir": str(scratch / "data"), "engine.model": str(base), "trainer.dtype": args.dtype,
        "trainer.finetune": "lora"})
    tcfg = cfg.trainer
    acc = Accelerator(cpu=args.device == "cpu")
    tokenizer = load_tokenizer(base)
    model, _ = load_policy(tcfg, base, Version(0, base, "full"))
    model = model.to(acc.device)
    teacher = Teacher(tcfg, model, base, acc.device)
    params = [p for n, p in model.named_parameters() if p.requires_grad and f".{TEACHER_ADAPTER}." not in n]
    optimizer = torch.optim.AdamW(params, lr=tcfg.learning_rate, weight_decay=tcfg.weight_decay)
    model, optimizer = acc.prepare(model, optimizer)
    policy = Policy(model, params, teacher, tokenizer, acc)
    batch = make_batch(tokenizer, args.prompt_tokens, args.completion_tokens, args.samples or tcfg.batch_size, tcfg.learning_rate)
    before = [p.detach().clone() for p in params]
    setup_s = time.perf_counter() - t_setup
    cuda = acc.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(acc.device)
    times, m = [], None
    for _ in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        m = train_step(policy, optimizer, batch, tcfg)
        if cuda:
            torch.cuda.synchronize(acc.device)
        times.append(time.perf_counter() - t0)
    assert m is not None
    step_s = statistics.median(times[args.warmup:])
    peak = (torch.cuda.max_memory_allocated(acc.device) if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    d = m.as_dict()
    return {
        "model": ("Qwen2 (tiny)" if args.tiny else "Qwen2.5-Coder-1.5B shapes") + ", random init",
        "device": torch.cuda.get_device_name(acc.device) if cuda else "cpu", "dtype": args.dtype,
        "params": sum(p.numel() for p in model.parameters()), "trainable": sum(p.numel() for p in params),
        "prompt_tokens": [len(s.prompt_ids) for s in batch.samples], "completion_tokens": args.completion_tokens,
        "packed": d["passes"] < len(batch.samples), "step_s": round(step_s, 3),
        "tokens_per_s": round(d["tokens"] / step_s, 1), "peak_memory_gib": round(peak / 2**30, 3),
        "setup_s": round(setup_s, 1), "steps": args.steps,
        "trainable_tensors": len(params), "params_moved": sum(not torch.equal(a, b.detach()) for a, b in zip(before, params, strict=True)),
        **{k: d[k] for k in ("tokens", "forwarded_tokens", "passes", "opd_samples", "loss", "grad_norm")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="2-layer model of the same family (the CPU test)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="trainer.dtype")
    ap.add_argument("--samples", type=int, default=None, help="samples in the batch (default trainer.batch_size)")
    ap.add_argument("--prompt-tokens", type=int, default=3500,
                    help="about this many prompt tokens a sample (the system prompt cut to fit)")
    ap.add_argument("--completion-tokens", type=int, default=200, help="tokens of each sampled answer")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    print(json.dumps(run(ap.parse_args()), indent=2))


if __name__ == "__main__":
    main()
