"""``engine.kind: llamacpp`` for real: the pinned llama-server (built once, ``make llamacpp``),
started the way `clawproxy start` starts the engine, serving the bundled SmolLM2-135M converted to
a float32 GGUF.

- What is recorded is what the trainer computes: the served ids' log-probs equal a float32
  transformers forward pass of the trainer's model, base and with a LoRA adapter (tolerance 5e-3,
  the vLLM test's; llama.cpp's float32 kernels sum in another order).
- A published adapter is served by a new llama-server once ready; requests running across the
  publish finish, none fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

from clawproxy.engine.client import EngineClient
from tests.net import held_port, stop
from tests.waits import until_sync

MODEL = "smol-llamacpp"
ROOT = Path(__file__).resolve().parents[2]
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def chat(url: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def ask(question: str = "Say hi.", **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 12,
            "temperature": 0, "logprobs": True, "return_token_ids": True, **extra}


@pytest.fixture(scope="module")
def served(default_model_dir, tmp_path_factory):
    from clawproxy.engine import llamacpp_build

    llamacpp_build.build(echo=False)  # ~5 min once per machine; `make llamacpp` does it ahead
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("llamacpp")
    base = root / "base"
    shutil.copytree(default_model_dir, base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False))  # B != 0: it changes answers
    peft_model.save_pretrained(root / "adapter")
    config = root / "engine.yaml"
    with held_port() as port:
        config.write_text(yaml.safe_dump({"data_dir": str(root / "data"), "engine": {
            "kind": "llamacpp", "model": str(base), "dtype": "float32", "served_model_name": MODEL,
            "port": port, "max_model_len": 2048, "max_batch_size": 4, "threads": 2}}))
        log = root / "engine.log"
        proc = subprocess.Popen([sys.executable, "-m", "clawproxy.engine", "--config", str(config)],
                                stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    def healthy() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            with _OPENER.open(url + "/health", timeout=2):
                return True
        except OSError:
            return False

    try:
        until_sync(healthy, f"the llamacpp engine to answer /health (log: {log})", timeout=300)
        yield url, base, root / "adapter", log
    finally:
        stop(proc)


def _forward_logprobs(model_dir: Path, prompt: list[int], completion: list[int], adapter: Path | None = None):
    """log p(completion token | prefix) from a transformers forward pass, in float32."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    logps = torch.log_softmax(logits, -1)
    return [float(logps[i, t]) for i, t in enumerate(completion)]


def _recorded(body: dict) -> tuple[list[int], list[int], list[float]]:
    choice = body["choices"][0]
    return body["prompt_token_ids"], choice["token_ids"], [t["logprob"] for t in choice["logprobs"]["content"]]


def test_served_logprobs_equal_a_forward_pass_and_an_adapter_is_published_without_a_failed_request(served):
    url, base, adapter, log = served
    status, body = chat(url, ask())
    assert status == 200, body
    prompt, completion, served_lp = _recorded(body)
    assert len(completion) == len(served_lp) > 0
    gap = max(abs(a - b) for a, b in zip(served_lp, _forward_logprobs(base, prompt, completion), strict=True))
    assert gap < 5e-3, gap

    # users keep talking while the adapter is published: no request fails, each is whole
    failures: list[str] = []
    done = threading.Event()

    def talk() -> None:
        while not done.is_set():
            s, b = chat(url, ask("Name a colour.", max_tokens=24))
            if s != 200 or not b["choices"][0]["token_ids"]:
                failures.append(f"{s} {b}")

    users = [threading.Thread(target=talk) for _ in range(2)]
    for t in users:
        t.start()
    client = EngineClient(url, kind="llamacpp")
    assert client.weight_version() == 0
    try:
        client.load_weights(str(adapter), 1, lora=True)
    finally:
        done.set()
        for t in users:
            t.join(120)
    assert failures == []
    assert client.weight_version() == 1

    status, body = chat(url, ask())
    assert status == 200, body
    prompt, completion, served_lp = _recorded(body)
    forward = _forward_logprobs(base, prompt, completion, adapter)
    gap = max(abs(a - b) for a, b in zip(served_lp, forward, strict=True))
    assert gap < 5e-3, gap
    # the publish really changed the served model
    plain = _forward_logprobs(base, prompt, completion)
    assert max(abs(a - b) for a, b in zip(served_lp, plain, strict=True)) > 10 * gap + 1e-3


def test_a_streamed_answer_records_every_token_and_a_cancelled_one_frees_the_server(served):
    url, *_ = served
    req = urllib.request.Request(url + "/v1/chat/completions", method="POST",
                                 data=json.dumps(ask("Write a haiku about rain 🌧️.", max_tokens=40, stream=True,
                                                     temperature=1.0, seed=3)).encode(),
                                 headers={"Content-Type": "application/json"})
    ids: list[int] = []
    logps: list[float] = []
    text = []
    with _OPENER.open(req, timeout=120) as resp:
        for line in resp:
            if line.startswith(b"data: {"):
                ev = json.loads(line[6:])
                for ch in ev.get("choices", []):
                    ids += ch.get("token_ids") or []
                    logps += [t["logprob"] for t in (ch.get("logprobs") or {}).get("content") or []]
                    text.append(ch.get("delta", {}).get("content") or "")
    assert ids and len(ids) == len(logps)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(served[1])
    assert tok.decode(ids, skip_special_tokens=True).startswith("".join(text).strip()[:10])
    # a client that goes away mid-answer: its request ends there, not after 400 tokens
    req = urllib.request.Request(url + "/v1/chat/completions", method="POST",
                                 data=json.dumps(ask(max_tokens=400, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    resp = _OPENER.open(req, timeout=120)
    resp.readline()
    resp.close()

    def running() -> int:
        with _OPENER.open(url + "/health", timeout=10) as r:
            return int(json.loads(r.read())["running"])

    until_sync(lambda: running() == 0, "the hung-up request to end on llama-server", timeout=60)
    assert chat(url, ask(max_tokens=2))[0] == 200
