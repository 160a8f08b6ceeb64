"""Streaming a chat request to an engine and timing its tokens: what the serving benchmarks share
(``from _stream import stream_body, decode_rate``)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from clawproxy.httpjson import open_url


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


def decode_rate(res: dict) -> float:
    a = res["arrivals"]
    return (len(a) - 1) / (a[-1] - a[0])
