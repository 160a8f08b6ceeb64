"""``engine.kind: llamacpp`` for real: the pinned llama-server (built once, ``make llamacpp``),
started the way `clawproxy start` starts the engine, serving the bundled SmolLM2-135M converted to
a float32 GGUF.

- What is recorded is what the trainer computes: the served ids' log-probs equal a float32
  transformers forward pass of the trainer's model, base and with a LoRA adapter (tolerance 5e-3,
  the vLLM test's; llama.cpp's float32 kernels sum in another order).
- A published adapter is served by a new llama-server once ready; requests running across the
  publish finish, none fails.
- Adapters are served by name, side by side, as vLLM serves them: each request gets the adapter its
  ``model`` names (log-probs equal that adapter's forward pass, its weight version on every chunk),
  the base name gets the base model, an unknown or unloaded name gets vLLM's 404; KV computed under
  one adapter never serves a request for another.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

from clawproxy.engine.client import EngineClient
from clawproxy.errors import EngineError
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
    from clawproxy.engine.llamacpp import build as llamacpp_build

    llamacpp_build.build(echo=False)  # ~5 min once per machine; `make llamacpp` does it ahead
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("llamacpp")
    base = root / "base"
    shutil.copytree(default_model_dir, base)
    for seed, name in ((0, "adapter"), (1, "second")):
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                      init_lora_weights=False))  # B != 0: it changes answers
        peft_model.save_pretrained(root / name)
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


def _gap(body: dict, base: Path, adapter: Path | None) -> float:
    """The largest gap between the served log-probs and a forward pass of ``adapter`` (None: the base)."""
    prompt, completion, served_lp = _recorded(body)
    assert len(completion) == len(served_lp) > 0
    forward = _forward_logprobs(base, prompt, completion, adapter)
    return max(abs(a - b) for a, b in zip(served_lp, forward, strict=True))


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
    assert client.served_adapters() == {"clawproxy": str(adapter)}

    # published under the trainer's name: a request naming it gets the adapter, the base name the base
    status, body = chat(url, ask())
    assert status == 200 and body["weight_version"] == 0, body
    assert _gap(body, base, None) < 5e-3
    status, body = chat(url, ask(model="clawproxy"))
    assert status == 200 and body["model"] == "clawproxy" and body["weight_version"] == 1, body
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


def _stream(url: str, body: dict, first: threading.Event) -> tuple[list[int], list[int | None], str | None]:
    """A streamed answer's completion ids, the weight version on each chunk, and its finish reason;
    ``first`` is set at its first token."""
    req = urllib.request.Request(url + "/v1/chat/completions", method="POST",
                                 data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    ids: list[int] = []
    versions: list[int | None] = []
    finish = None
    with _OPENER.open(req, timeout=300) as resp:
        for line in resp:
            if line.startswith(b"data: {"):
                ev = json.loads(line[6:])
                assert "error" not in ev, ev
                versions.append(ev.get("weight_version"))
                for ch in ev.get("choices", []):
                    ids += ch.get("token_ids") or []
                    finish = ch.get("finish_reason") or finish
                if ids:
                    first.set()
    return ids, versions, finish


@pytest.mark.timeout(900)  # four llama-server starts, three adapter conversions, three forward passes
def test_adapters_are_served_by_name_side_by_side_and_unloaded(served):
    url, base, adapter, log = served
    second = adapter.parent / "second"
    client = EngineClient(url, kind="llamacpp")
    client.load_weights(str(adapter), 1, lora=True)  # as the first test left it, when run alone
    client.load_adapter(str(second), "second")
    assert client.served_adapters() == {"clawproxy": str(adapter), "second": str(second)}
    cards = {c["id"]: c for c in json.loads(_OPENER.open(url + "/v1/models", timeout=10).read())["data"]}
    assert cards[MODEL]["parent"] is None and cards["second"]["parent"] == MODEL

    # each name gets its own weights, at its own version; the two adapters answer differently
    answers = {}
    for name, weights, version in ((MODEL, None, 0), ("clawproxy", adapter, 1), ("second", second, 2)):
        status, body = chat(url, ask(model=name))
        assert status == 200 and body["weight_version"] == version, body
        assert _gap(body, base, weights) < 5e-3, name
        answers[name] = body
    prompt, completion, _ = _recorded(answers["second"])
    other = _forward_logprobs(base, prompt, completion, adapter)
    assert max(abs(a - b) for a, b in zip(_recorded(answers["second"])[2], other, strict=True)) > 1e-2


    # an unknown name is vLLM's 404, which the proxy answers by loading the adapter again
    status, body = chat(url, ask(model="no-such-adapter"))
    assert status == 404, body
    err = body["error"]
    assert err["type"] == "NotFoundError" and err["code"] == 404 and err["param"] == "model"
    assert err["message"] == "The model `no-such-adapter` does not exist."

    client.unload_adapter("second")
    assert client.served_adapters() == {"clawproxy": str(adapter)}
    assert chat(url, ask(model="second"))[0] == 404
    with pytest.raises(EngineError) as info:
        client.unload_adapter("second")
    assert info.value.status == 404

    # a request streaming across a load finishes on the weights it started with, and its server
    # then stops; the serving llama-server is frozen from its first token until the load is done
    result: list = []
    first = threading.Event()
    t = threading.Thread(target=lambda: result.append(_stream(url, ask(model="clawproxy", max_tokens=16,
                                                                       ignore_eos=True), first)))
    t.start()
    assert first.wait(120), result
    (old,) = _llama_servers(base.parent / "data")
    os.kill(old, signal.SIGSTOP)
    try:
        client.load_adapter(str(second), "third")
        assert t.is_alive()
    finally:
        os.kill(old, signal.SIGCONT)
    t.join(300)
    ids, versions, finish = result[0]
    assert len(ids) == 16 and finish == "length"
    assert set(versions) == {1}
    until_sync(lambda: old not in _llama_servers(base.parent / "data"), "the old llama-server to stop", timeout=60)
    assert client.served_adapters() == {"clawproxy": str(adapter), "third": str(second)}
    status, body = chat(url, ask(model="third"))
    assert status == 200 and body["weight_version"] == 3 and _gap(body, base, second) < 5e-3
    # the files of adapters no server reads any more are gone
    files = sorted(p.name for p in (base.parent / "data" / "llamacpp" / "adapters").glob("*.gguf"))
    assert files == ["clawproxy-v1.gguf", "third-v3.gguf"], files


def _llama_servers(data_dir: Path) -> list[int]:
    """The llama-server processes serving the model of ``data_dir``."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            argv = cmdline.read_bytes().split(b"\0")
            if argv[0].endswith(b"llama-server") and str(data_dir).encode() in b" ".join(argv):
                pids.append(int(cmdline.parent.name))
    return pids


def test_kv_computed_under_an_adapter_never_serves_another_request(served, tmp_path):
    """llama-server's RAM prompt cache keys a prompt by its tokens alone: a slot that takes in a prompt
    computed under an adapter keeps it for a request without one (only a slot's own scales are
    compared). Pinned slots make the hand-over certain: slot 0 answers P with the adapter, slot 1 Q
    without (which stores slot 0's P in the RAM cache), then slot 1 answers P without. The server
    started as LlamaCppEngine starts it must recompute P."""
    from transformers import AutoTokenizer

    from clawproxy.engine.llamacpp.build import require
    from clawproxy.engine.llamacpp.engine import Adapter, Instance, LlamaCppEngine, convert_adapter

    url, base, adapter, log = served
    llama = require()
    model_gguf = next((base.parent / "data" / "llamacpp" / "models").glob("*.gguf"))
    gguf = convert_adapter(llama, adapter, base, tmp_path / "adapter.gguf")
    tok = AutoTokenizer.from_pretrained(base)
    engine = LlamaCppEngine(llama, model_gguf, base, tok, set(), work_dir=tmp_path, max_batch_size=4,
                            max_model_len=512, threads=2)
    with_adapter = (Adapter("clawproxy", str(adapter), 1, gguf),)
    inst = Instance(engine.argv(with_adapter), 0, tmp_path / "llama-server.log", with_adapter)
    try:
        inst.wait_ready()

        def complete(text: str, slot: int, name: str | None) -> tuple[list[int], list[int], list[float]]:
            prompt = tok(text, add_special_tokens=False)["input_ids"]
            body = {"prompt": prompt, "n_predict": 6, "temperature": 0, "n_probs": 1, "cache_prompt": True,
                    "id_slot": slot, "lora": inst.lora(name), "top_k": 0, "min_p": 0.0}
            conn = inst.connection(timeout=300)
            try:
                conn.request("POST", "/completion", json.dumps(body), {"Content-Type": "application/json"})
                out = json.loads(conn.getresponse().read())
            finally:
                conn.close()
            probs = out["completion_probabilities"]
            return prompt, [e["id"] for e in probs], [e["logprob"] for e in probs]

        sea = "The sea at night is"
        complete(sea, 0, "clawproxy")
        complete("1, 2, 3, 4,", 1, None)
        prompt, completion, served_lp = complete(sea, 1, None)
    finally:
        inst.stop()
    forward = _forward_logprobs(base, prompt, completion)
    assert max(abs(a - b) for a, b in zip(served_lp, forward, strict=True)) < 5e-3


def test_an_unbuilt_llama_server_says_how_to_build_it(tmp_path):
    from clawproxy.engine.llamacpp.build import require
    from clawproxy.errors import ConfigError

    with pytest.raises(ConfigError, match="make llamacpp"):
        require(tmp_path)  # an empty cache: nothing built there
