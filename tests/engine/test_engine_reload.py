"""Hot weight reload on a real engine process: under load, refused checkpoints, LoRA, auth."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from clawproxy.engine.client import EngineClient
from clawproxy.errors import EngineError
from tests.rig.engine_proc import chat, engine_process, forward_logprobs, request, stream_chat

TOKEN = "s3cret"
MSGS = [{"role": "user", "content": "Count to ten."}]
GREEDY = {"messages": MSGS, "max_tokens": 16, "temperature": 0, "logprobs": True,
          "return_token_ids": True}


def _tiny_variant(src: Path, out: Path, seed: int, **config_overrides) -> Path:
    """A checkpoint with the tiny model's architecture (or an altered one) and fresh weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(src)
    for k, v in config_overrides.items():
        setattr(config, k, v)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def ckpts(tiny_model_dir, tmp_path_factory):
    import torch
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("ckpts")
    new = _tiny_variant(tiny_model_dir, root / "v1", seed=123, initializer_range=0.3)
    wrong = _tiny_variant(tiny_model_dir, root / "wrong-shape", seed=1, hidden_size=32,
                          intermediate_size=64, head_dim=8)
    nan = root / "nan"
    nan.mkdir()
    for f in new.iterdir():
        (nan / f.name).write_bytes(f.read_bytes())
    state = load_file(str(new / "model.safetensors"))
    key = next(k for k in state if k.endswith("q_proj.weight"))
    state[key][0, 0] = float("nan")
    save_file(state, str(nan / "model.safetensors"), metadata={"format": "pt"})
    missing = root / "missing"
    missing.mkdir()
    (missing / "config.json").write_text((new / "config.json").read_text())
    return {"new": new, "wrong": wrong, "nan": nan, "missing": missing, "torch": torch}


@pytest.fixture(scope="module")
def engine_url(tiny_model_dir, tmp_path_factory):
    with engine_process(tiny_model_dir, tmp_path_factory.mktemp("reload-data"),
                        "--control-token", TOKEN) as url:
        yield url


def _load(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


def _greedy(url: str) -> dict:
    r = chat(url, GREEDY)
    assert r.status_code == 200, r.text
    return r.json()


def test_control_needs_the_token(engine_url):
    r = request("POST", engine_url + "/pause?mode=keep")
    assert r.status_code == 401 and "Bearer" in r.json()["error"]["message"]
    with pytest.raises(EngineError) as info:
        EngineClient(engine_url, token="wrong").pause()
    assert info.value.status == 401
    assert EngineClient(engine_url, token=TOKEN).is_paused() is False


def test_hot_reload_under_load(engine_url, tiny_model_dir, ckpts):
    client = EngineClient(engine_url, token=TOKEN)
    v0 = client.weight_version()
    before = _greedy(engine_url)
    progress = {i: threading.Event() for i in range(4)}

    def one(i: int):
        def seen(chunk: dict) -> None:
            if len(chunk["choices"]) and chunk["choices"][0].get("token_ids"):
                progress[i].set()

        return stream_chat(engine_url, {"messages": [{"role": "user", "content": f"story {i}"}],
                                        "max_tokens": 400, "temperature": 0.7, "seed": i,
                                        "return_token_ids": True,
                                        "stream_options": {"include_usage": True}}, seen)

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(one, i) for i in range(4)]
        for ev in progress.values():
            assert ev.wait(30)
        assert client.load_weights(str(ckpts["new"]), v0 + 1) == v0 + 1
        results = [f.result(120) for f in futures]

    spanning = 0
    for chunks, done, headers in results:
        assert done, "a stream ended without [DONE]"
        assert headers["x-weight-version"] == str(v0)
        versions = [c["weight_version"] for c in chunks]
        assert versions == sorted(versions) and set(versions) <= {v0, v0 + 1}
        spanning += {v0, v0 + 1} <= set(versions)
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == 400
    assert spanning >= 1, "no stream was in flight across the reload"

    after = _greedy(engine_url)
    assert after["weight_version"] == v0 + 1 == client.weight_version()
    ids, prompt = after["choices"][0]["token_ids"], after["prompt_token_ids"]
    got = [e["logprob"] for e in after["choices"][0]["logprobs"]["content"]]
    assert got == pytest.approx(forward_logprobs(_load(ckpts["new"]), prompt, ids), abs=2e-3)
    old_lps = forward_logprobs(_load(tiny_model_dir), prompt, ids)
    assert max(abs(a - b) for a, b in zip(got, old_lps, strict=True)) > 0.05
    assert ids != before["choices"][0]["token_ids"]


@pytest.mark.parametrize(
    "which, needle",
    [("missing", "no model.safetensors"), ("wrong", "shape"), ("nan", "NaN"), ("nowhere", "does not exist")],
)
def test_bad_checkpoint_is_refused_and_old_weights_keep_serving(engine_url, ckpts, which, needle):
    client = EngineClient(engine_url, token=TOKEN)
    version = client.weight_version()
    before = _greedy(engine_url)
    path = ckpts.get(which, Path("/nonexistent/checkpoint"))
    with pytest.raises(EngineError) as info:
        client.load_weights(str(path), version + 1)
    assert info.value.status == 400 and needle in info.value.message
    assert client.weight_version() == version and not client.is_paused()
    after = _greedy(engine_url)
    assert after["choices"][0]["token_ids"] == before["choices"][0]["token_ids"]
    assert after["weight_version"] == version


def test_lora_adapter_merges_into_the_base(engine_url, tiny_model_dir, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model

    base = _load(tiny_model_dir)
    torch.manual_seed(5)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    merged = peft_model.merge_and_unload().eval()

    client = EngineClient(engine_url, token=TOKEN)
    version = client.weight_version() + 1
    assert client.load_weights(str(adapter), version, lora=True) == version
    out = _greedy(engine_url)
    assert out["weight_version"] == version
    ids, prompt = out["choices"][0]["token_ids"], out["prompt_token_ids"]
    got = [e["logprob"] for e in out["choices"][0]["logprobs"]["content"]]
    assert got == pytest.approx(forward_logprobs(merged, prompt, ids), abs=2e-3)

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{}")
    with pytest.raises(EngineError) as info:
        client.load_weights(str(broken), version + 1, lora=True)
    assert "adapter_model.safetensors" in info.value.message
    assert client.weight_version() == version
