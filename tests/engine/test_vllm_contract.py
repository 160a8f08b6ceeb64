"""The vLLM contract (vllm_contract.py) against the fake of vLLM 0.33.0, plus what only the fake
can show: servers started without the env vars, an older vLLM, a busy prefix cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from clawproxy.engine.client import EngineClient
from clawproxy.errors import EngineError
from tests.fakes.fake_vllm import CALLS, STATE, create_fake_vllm
from tests.fakes.serve import serve_in_thread
from tests.rig.vllm_contract import *  # noqa: F403 (the shared contract tests)
from tests.rig.vllm_contract import Target

MODEL = "Qwen/Qwen3-4B"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def write_full(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    save_file({"model.embed_tokens.weight": rng.standard_normal((8, 4), dtype=np.float32),
               "model.norm.weight": np.ones(4, dtype=np.float32)}, str(path / "model.safetensors"))
    return path


def write_adapter(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "target_modules": ["q_proj"]}))
    save_file({"base_model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((2, 4), dtype=np.float32),
               "base_model.model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros((4, 2), dtype=np.float32)},
              str(path / "adapter_model.safetensors"))
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpts")
    return write_full(root / "base"), write_full(root / "v1", seed=1), write_adapter(root / "adapter")


@pytest.fixture
def fake_app():
    return create_fake_vllm(model=MODEL, api_key="sk-test")


@pytest.fixture
def target(fake_app, dirs):
    base, full, adapter = dirs
    with serve_in_thread(fake_app) as url:
        yield Target(url, MODEL, "sk-test", base, full, adapter, state=fake_app[STATE])


def _control(app) -> list[tuple[str, str]]:
    return [(m, p) for m, p, _ in app[CALLS] if not p.startswith("/v1/chat")]


# -- the exact sequence the client sends ---------------------------------------------------------


def test_full_reload_sends_the_dev_mode_sequence(target, fake_app):
    client = target.client()
    client.load_weights(str(target.full_ckpt), 3)
    assert _control(fake_app) == [
        ("POST", "/pause?mode=keep"),
        ("POST", "/collective_rpc"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/update_weight_version"),
        ("POST", "/resume"),
    ]
    assert fake_app[CALLS][1][2] == {"method": "reload_weights", "kwargs": {"weights_path": str(target.full_ckpt)}}
    assert fake_app[STATE]["weight_version"] == "3"


def test_busy_prefix_cache_is_reset_with_running_requests_preempted(target, fake_app):
    fake_app[STATE]["prefix_cache_busy"] = True
    assert target.client().reset_prefix_cache() is True
    assert _control(fake_app)[-1] == ("POST", "/reset_prefix_cache?reset_running_requests=true")


def test_a_prefix_cache_that_stays_full_fails_the_reload_and_resumes(target, fake_app, monkeypatch):
    monkeypatch.setattr(EngineClient, "reset_prefix_cache", lambda self: False)
    client = target.client()
    with pytest.raises(EngineError, match="prefix cache could not be reset"):
        client.load_weights(str(target.full_ckpt), 2)
    assert not client.is_paused()


def test_fresh_server_reports_the_base_version_then_the_loaded_one(target):
    client = target.client(initial_version=7)
    assert client.weight_version() == 0  # "default": a (re)started server serves the base model
    client.load_weights(str(target.full_ckpt), 8)
    assert client.weight_version() == 8


def test_without_weight_info_the_client_keeps_the_version(dirs):
    base, full, _ = dirs
    app = create_fake_vllm(model=MODEL, weight_info=False, version="0.20.0")
    with serve_in_thread(app) as url:
        client = EngineClient(url, kind="vllm", initial_version=5)
        assert client.weight_version() == 5
        client.load_weights(str(full), 6)
        assert client.weight_version() == 6
        client.load_weights(str(full), 7)
        calls = _control(app)
        assert calls.count(("GET", "/weight_info")) == 1  # probed once: 404, then not asked again
        assert ("POST", "/update_weight_version") not in calls


def test_503_is_transient_not_a_refusal():
    from trainer.checkpoints import is_refusal

    assert not is_refusal(EngineError("paused", status=503))
    assert is_refusal(EngineError("bad adapter", status=500))
    assert is_refusal(EngineError("no adapter", status=404))


# -- attach check: one line that says what to change ---------------------------------------------


@pytest.mark.parametrize("kwargs, lora, expected", [
    ({"version": "0.15.1"}, False, "is 0.15.1; clawproxy needs vllm>=0.16.0"),
    ({"dev_mode": False}, False, "VLLM_SERVER_DEV_MODE=1"),
    ({"runtime_lora": False}, True, "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"),
])
def test_attach_check_says_what_to_change(kwargs, lora, expected):
    with serve_in_thread(create_fake_vllm(model=MODEL, api_key="k", **kwargs)) as url:
        with pytest.raises(EngineError) as info:
            EngineClient(url, kind="vllm", token="k").check_vllm(lora=lora)
    assert expected in info.value.message and "\n" not in info.value.message


@pytest.mark.parametrize("kind, refused", [("vllm", True), ("embedded", False)])
def test_the_attach_check_is_the_engine_specs(kind, refused):
    # the supervisor and `clawproxy train` call check(); only a spec with a control plane to check asks
    with serve_in_thread(create_fake_vllm(model=MODEL, dev_mode=False)) as url:
        client = EngineClient(url, kind=kind)
        assert client.spec.checks_control_plane is refused
        if refused:
            with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE=1"):
                client.check(lora=False)
        else:
            client.check(lora=True)


def test_attach_check_accepts_full_finetuning_without_runtime_lora():
    with serve_in_thread(create_fake_vllm(model=MODEL, runtime_lora=False)) as url:
        EngineClient(url, kind="vllm").check_vllm(lora=False)


def test_without_runtime_lora_the_route_is_a_plain_404():
    with serve_in_thread(create_fake_vllm(model=MODEL, runtime_lora=False)) as url:
        with pytest.raises(EngineError) as info:
            EngineClient(url, kind="vllm").load_adapter("/x")
    assert info.value.status == 404 and info.value.message.endswith(": Not Found")


def test_api_key_guards_v1_only(target):
    wrong = EngineClient(target.url, kind="vllm", token="nope")
    assert wrong.is_paused() is False  # dev routes are not under /v1
    with pytest.raises(EngineError) as info:
        wrong.served_adapters()
    assert info.value.status == 401


def test_start_refuses_a_vllm_without_runtime_lora_in_one_line(tmp_path):
    from clawproxy.config import load_config
    from clawproxy.errors import ConfigError
    from clawproxy.supervisor import check_attached_vllm

    with serve_in_thread(create_fake_vllm(model=MODEL, runtime_lora=False)) as url:
        cfg = load_config(str(CONFIGS / "gpu-1.yaml"), {"data_dir": str(tmp_path), "proxy.upstream": url})
        with pytest.raises(ConfigError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"):
            check_attached_vllm(cfg)
        check_attached_vllm(load_config(str(CONFIGS / "gpu-multi.yaml"), {"data_dir": str(tmp_path),
                                                                   "proxy.upstream": url}))
    with pytest.raises(ConfigError, match="start vLLM first"):
        check_attached_vllm(cfg)  # nothing listens there any more
