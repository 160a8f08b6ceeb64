"""The two engines side by side on the same model and prompt: vLLM (the default) and the embedded one.

Each engine is started the way `clawproxy start` starts it (`python -m clawproxy.engine --kind K`),
with the same model, dtype and thread count, one after the other (never both at once on the CPU).
Per engine: one warm-up request, then ``--rounds`` streamed requests of a ~``--prompt-tokens`` prompt
(a different first line each round, so no prefix cache helps) decoding ``--tokens`` tokens with
``ignore_eos``: the median TTFT and decode tok/s, and the ratio of the two engines.

    .venv/bin/python bench/engine_compare.py --model smollm2-135m --dtype float32 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

from _env import ROOT, reserve_port
from engine import decode_rate, stream

from tests.net import stop


def serve(kind: str, args) -> tuple[subprocess.Popen, str, str]:
    port = reserve_port()
    log = tempfile.NamedTemporaryFile(prefix=f"bench-{kind}-", suffix=".log", delete=False)
    argv = [sys.executable, "-m", "clawproxy.engine", "--kind", kind, "--model", args.model, "--port", str(port),
            "--dtype", args.dtype, "--max-model-len", str(args.max_model_len), "--log-level", "WARNING",
            "--tool-call-parser", "", "--data-dir", tempfile.mkdtemp(prefix="bench-compare-")]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT), f"http://127.0.0.1:{port}", log.name


def wait(url: str, proc: subprocess.Popen, log: str) -> float:
    from clawproxy.httpjson import answers_ok

    t0 = time.monotonic()
    while not answers_ok(url + "/health"):
        if proc.poll() is not None or time.monotonic() - t0 > 900:
            raise SystemExit(f"engine did not start; see {log}")
        time.sleep(0.5)
    return time.monotonic() - t0


def prompt(tokenizer, n: int, round_: int) -> str:
    text = f"Round {round_}. Read this and then keep writing.\n"
    filler = "The river runs past the old mill and the stone bridge, under grey autumn clouds. "
    while len(tokenizer(text)["input_ids"]) < n:
        text += filler
    return text


def measure(kind: str, tokenizer, args) -> dict:
    proc, url, log = serve(kind, args)
    try:
        start_s = wait(url, proc, log)
        stream(url, "Say hi.", 4)  # warm-up: first-request compilation and allocation
        ttft, rates = [], []
        for r in range(args.rounds):
            res = stream(url, prompt(tokenizer, args.prompt_tokens, r), args.tokens)
            ttft.append(res["ttft"])
            rates.append(decode_rate(res))
            print(f"  {kind} round {r}: {res['prompt_tokens']} prompt tokens, TTFT {res['ttft']:.2f} s, "
                  f"decode {rates[-1]:.1f} tok/s", flush=True)
    finally:
        stop(proc)
    return {"engine": kind, "start_s": round(start_s, 1), "ttft_s": round(statistics.median(ttft), 2),
            "decode_tok_s": round(statistics.median(rates), 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads of each engine (0: its own default)")
    ap.add_argument("--prompt-tokens", type=int, default=4000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-model-len", type=int, default=8192)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from clawproxy.engine.model import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(args.model)))
    rows = [measure(kind, tokenizer, args) for kind in ("embedded", "vllm")]
    old, new = rows
    out = {"model": args.model, "dtype": args.dtype, "threads": args.threads, "prompt_tokens": args.prompt_tokens,
           "rows": rows, "ttft_ratio_old_over_new": round(old["ttft_s"] / new["ttft_s"], 2),
           "decode_ratio_new_over_old": round(new["decode_tok_s"] / old["decode_tok_s"], 2)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
