"""vLLM CPU against llama.cpp (bf16 and the catalog's Q4_K_M) on this machine, in one run.

Each engine is started the way `clawproxy start` starts it (``python -m clawproxy.engine`` with the
engine's config: vLLM in bfloat16 with LoRA on; ``engine.kind: llamacpp`` in bfloat16 and with
``engine.quantization: q4_k_m``), one at a time, on the same threads, and measured with the same
client (a streamed chat request through clawproxy's own stream reader):

- decode tok/s of a greedy ``--tokens``-token answer (ignore_eos), and its bound: the machine's read
  bandwidth (``bench/bandwidth.py``, measured at the start) over the bytes read per token (every
  served tensor but the token embedding table);
- TTFT of a ~``--prompt-tokens``-token prompt on a fresh server (no prefix hit), then of the same
  prompt with a new last line (a later session's turn 1: the shared prefix is cached);
- the served log-probs of a 64-token greedy answer against the trainer's float32 forward pass;
- llamacpp only: publishing a random LoRA adapter (rank 16, q/k/v/o, served by name as
  ``clawproxy``) while two users stream answers: seconds from the call to the new version serving,
  and failed requests; beside it, llama.cpp's ``convert_lora_to_gguf.py`` on the same adapter (the
  conversion a publish ran before).

    .venv/bin/python bench/engines_cpu.py [--engines vllm,vllm-w4a16,llamacpp-bf16,llamacpp-q4km] --out engines.json

The output names the CPU flags the choice of ``engine.kind: auto`` rests on and what it chooses here.
    .venv/bin/python bench/engines_cpu.py --engines llamacpp-bf16 --model default --tokens 8 --prompt-tokens 300  # tiny
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
from pathlib import Path
from typing import Any

from _env import ROOT, reserve_port
from _stream import decode_rate, stream_body
from bandwidth import memory_bandwidth
from quant_serving import prompt_of, serving_bytes

from clawproxy.errors import ClawproxyError
from clawproxy.httpjson import open_url

# the flags the engine choice and the kernels depend on, written beside every figure
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
ENGINES = {  # name -> engine settings
    "vllm": {"kind": "vllm", "dtype": "bfloat16", "quantization": "none", "kv_cache_gb": 2},
    # what engine.kind: vllm serves on a CPU without native bfloat16 (quantization auto)
    "vllm-w4a16": {"kind": "vllm", "dtype": "bfloat16", "quantization": "w4a16", "kv_cache_gb": 2},
    "llamacpp-bf16": {"kind": "llamacpp", "dtype": "bfloat16", "quantization": "none"},
    "llamacpp-q4km": {"kind": "llamacpp", "dtype": "bfloat16", "quantization": "q4_k_m"},
}
MODEL = "qwen2.5-coder-1.5b"


def chat(text: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": "bench", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


class Engine:
    def __init__(self, name: str, work: Path, threads: int, max_model_len: int, model: str):
        port = reserve_port()
        self.url = f"http://127.0.0.1:{port}"
        config = work / f"{name}.yaml"
        config.write_text(json.dumps({
            "data_dir": str(work / "data"),
            "engine": {"model": model, "served_model_name": "bench", "port": port, "threads": threads,
                       "max_model_len": max_model_len, "max_batch_size": 4, **ENGINES[name]},
            "trainer": {"finetune": "lora", "lora_r": 16}}))
        self.log = work / f"{name}.log"
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "clawproxy.engine", "--config", str(config)],
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited: {self.log.read_text()[-2000:]}")
            try:
                with open_url("GET", self.url + "/health", timeout=2):
                    break
            except (OSError, ClawproxyError):
                time.sleep(0.5)
        self.start_s = time.perf_counter() - t0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def served_bytes(gguf: Path) -> int:
    """Bytes of every tensor but the token embedding table (one row of it is read a token)."""
    sys.path.insert(0, str(_llama().root / "gguf-py"))
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors if t.name != "token_embd.weight")


def _llama() -> Any:
    from clawproxy.engine.llamacpp.build import require

    return require()


def forward_logprobs(model_dir: Path, prompt: list[int], completion: list[int]) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1:-1]
    logps = torch.log_softmax(logits.float(), -1)
    return [float(logps[i, t]) for i, t in enumerate(completion)]


def make_adapter(base: Path, out: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(0)
    get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                     init_lora_weights=False)).save_pretrained(out)
    return out


def publish_under_load(url: str, adapter: Path) -> dict[str, Any]:
    from clawproxy.engine.client import EngineClient

    failures: list[str] = []
    served = []
    done, published = threading.Event(), threading.Event()

    def talk() -> None:
        while not done.is_set():
            # the adapter is served by name: the proxy names it once it is published (proxy/routing.py)
            model = "clawproxy" if published.is_set() else "bench"
            try:
                res = stream_body(url, {**chat("Name a colour.", 16), "model": model})
                served.append(res["version"])
            except Exception as err:  # noqa: BLE001 (a failed request is the figure)
                failures.append(repr(err))

    users = [threading.Thread(target=talk) for _ in range(2)]
    for t in users:
        t.start()
    time.sleep(2)  # both users mid-answer when the publish starts
    t0 = time.perf_counter()
    EngineClient(url, kind="llamacpp", timeout=600).load_weights(str(adapter), 1, lora=True)
    seconds = time.perf_counter() - t0
    published.set()
    deadline = time.monotonic() + 300
    while 1 not in served and not failures and time.monotonic() < deadline:
        time.sleep(0.1)
    done.set()
    for t in users:
        t.join(300)
    return {"publish_to_serving_s": round(seconds, 2), "requests": len(served) + len(failures),
            "failed": len(failures), "served_by_v1": served.count(1), "errors": failures[:3],
            "script_convert_s": script_convert_s(adapter)}


def script_convert_s(adapter: Path) -> float:
    """The baseline in the same run: llama.cpp's convert_lora_to_gguf.py on the same adapter (what
    a publish ran before the engine wrote adapters itself)."""
    from clawproxy.engine.llamacpp.engine import _run_script

    llama = _llama()
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        _run_script(llama, [str(llama.convert_lora), str(adapter), "--base", base, "--outtype", "f32",
                            "--outfile", str(Path(tmp) / "adapter.gguf")])
        return round(time.perf_counter() - t0, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="vllm,llamacpp-bf16,llamacpp-q4km",
                    help=f"any of {', '.join(ENGINES)} (vllm-w4a16: what vLLM serves on a CPU without native bfloat16)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=4300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=MODEL, help="engine.model (q4km needs a catalog model's Q4_K_M file)")
    ap.add_argument("--memory-gib", type=float, default=1.0, help="array size of the read-bandwidth bound")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from clawproxy.catalog import fetch_gguf, get
    from clawproxy.engine.model import resolve_model

    model_dir = Path(resolve_model(args.model))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    long_prompt = prompt_of(tokenizer, args.prompt_tokens, "log")
    bw = memory_bandwidth(args.threads, gib=args.memory_gib)
    read_gb_s = bw["read_gb_s"]["best"]
    from clawproxy.engine_choice import choose, cpu_flags, this_machine

    flags = cpu_flags()
    results: dict[str, Any] = {"machine": {"cpus": len(os.sched_getaffinity(0)), "threads": args.threads,
                                           "read_gb_s": read_gb_s, "cpu_flags": [f for f in FLAGS if f in flags],
                                           "engine_auto": choose(this_machine("cpu")).kind}, "engines": {}}
    print("machine", json.dumps(results["machine"]), flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    adapter = make_adapter(model_dir, work / "adapter")
    for name in args.engines.split(","):
        eng = Engine(name, work, args.threads, max_model_len=args.prompt_tokens + 512, model=args.model)
        try:
            stream_body(eng.url, chat("hi", 4))  # warm-up
            decode = stream_body(eng.url, chat("Explain how a hash table works.", args.tokens, ignore_eos=True))
            ttft = stream_body(eng.url, chat(long_prompt, 1))["ttft"]
            ttft_cached = stream_body(eng.url, chat(long_prompt.replace("in one line", "in one word"), 1))["ttft"]
            ans = stream_body(eng.url, chat("Write a Python function that reverses a string.", 64, logprobs=True))
            gaps = [abs(a - b) for a, b in zip(ans["logprobs"], forward_logprobs(
                model_dir, ans["prompt_token_ids"], ans["token_ids"]), strict=True)]
            row: dict[str, Any] = {
                "start_s": round(eng.start_s, 1), "decode_tok_s": round(decode_rate(decode), 2),
                "ttft_s": round(ttft, 1), "ttft_cached_prefix_s": round(ttft_cached, 1),
                "logprob_gap_mean": round(statistics.fmean(gaps), 4), "logprob_gap_max": round(max(gaps), 4)}
            if ENGINES[name]["kind"] == "llamacpp":
                quant = ENGINES[name]["quantization"] == "q4_k_m"
                nbytes = served_bytes(fetch_gguf(get(args.model)) if quant else (
                    work / "data" / "llamacpp" / "models" / f"{model_dir.name}-bf16.gguf"))
            else:
                from clawproxy.engine.vllm.quantize import quantized_model

                served = quantized_model(model_dir, None, ENGINES[name]["quantization"])
                nbytes = serving_bytes(served, 2)[0]
            row["bytes_per_token"] = nbytes
            row["bound_tok_s"] = round(read_gb_s * 1e9 / nbytes, 1)
            row["of_bound"] = round(row["decode_tok_s"] / row["bound_tok_s"], 2)
            if ENGINES[name]["kind"] == "llamacpp":
                row["publish"] = publish_under_load(eng.url, adapter)
            results["engines"][name] = row
            print(name, json.dumps(row), flush=True)
            if args.out:  # after each engine: a later one that fails leaves the others' figures
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
        finally:
            eng.stop()


if __name__ == "__main__":
    main()
