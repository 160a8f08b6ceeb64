"""Config loading: file + dotted overrides, and messages that name the key to fix."""

from __future__ import annotations

import pytest

from clawproxy.config import load_config
from clawproxy.errors import ConfigError


def test_flag_overrides_an_empty_section(tmp_path):
    # `proxy:` with every key commented out loads as null; --port must still apply.
    p = tmp_path / "c.yaml"
    p.write_text("proxy:\nsessions:\n  idle_timeout_s: 60\n")
    cfg = load_config(p, {"proxy.port": 9999})
    assert cfg.proxy.port == 9999 and cfg.sessions.idle_timeout_s == 60


def test_yaml_exponent_without_dot_is_a_number(tmp_path):
    # YAML 1.1 reads `1e-5` as a string.
    p = tmp_path / "c.yaml"
    p.write_text("trainer:\n  learning_rate: 1e-5\nproxy:\n  port: '8090'\n")
    cfg = load_config(p)
    assert cfg.trainer.learning_rate == pytest.approx(1e-5) and cfg.proxy.port == 8090


@pytest.mark.parametrize("yaml_text, says", [
    # wrong types
    ("proxy:\n  port: 80a\n", ["proxy.port", "valid integer", "= '80a'"]),
    ("sessions:\n  idle_timeout_s: soon\n", ["sessions.idle_timeout_s", "valid number"]),
    ("proxy:\n  record_tokens: maybe\n", ["proxy.record_tokens", "valid boolean"]),
    ("trainer:\n  canary_prompts: What is 2+2?\n", ["trainer.canary_prompts", "valid list"]),
    ("trainer:\n  batch_size: 2.5\n", ["trainer.batch_size", "valid integer"]),
    ("proxy: 8080\n", ["proxy", "dictionary"]),
    # out of range
    ("engine:\n  port: -5\n", ["engine.port", "Engine port", "greater than or equal to 0", "= -5"]),
    ("proxy:\n  port: 70000\n", ["proxy.port", "less than or equal to 65535"]),
    ("engine:\n  max_batch_size: 0\n", ["engine.max_batch_size", "greater than or equal to 1"]),
    ("judge:\n  temperature: 3\n", ["judge.temperature", "less than or equal to 2"]),
    ("trainer:\n  learning_rate: 0\n", ["trainer.learning_rate", "greater than 0"]),
    ("trainer:\n  canary_prompts: []\n", ["trainer.canary_prompts", "at least 1 item"]),
    # not one of the choices, or an option that no longer exists
    ("engine:\n  dtype: fp8\n", ["engine.dtype", "'float32', 'bfloat16' or 'float16'"]),
    ("trainer:\n  method: ppo\n", ["trainer.method", "'rl', 'opd' or 'combined'"]),
    ("trainer:\n  truncated: negative\n", ["unknown config key trainer.truncated", "batch_size"]),
    ("trainer:\n  loss_norm: sequence\n", ["unknown config key trainer.loss_norm"]),
    # unknown keys, at the top and in a section
    ("proxi:\n  port: 1\n", ["unknown config key proxi", "proxy, sessions, engine"]),
    ("judge:\n  vote: 3\n", ["unknown config key judge.vote", "votes"]),
])
def test_bad_value_is_refused_with_what_to_change(tmp_path, yaml_text, says):
    p = tmp_path / "c.yaml"
    p.write_text(yaml_text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    for part in says:
        assert part in e.value.message, e.value.message


def test_flag_values_are_validated_like_the_file():
    with pytest.raises(ConfigError, match="engine.port"):
        load_config(None, {"engine.port": -5})


def test_every_field_has_help_text():
    import dataclasses

    from clawproxy.config import Config

    def walk(cls):
        for f in dataclasses.fields(cls):
            sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
            if sub is not None and dataclasses.is_dataclass(sub):
                yield from walk(sub)
            else:
                yield cls.__name__, f

    missing = [f"{c}.{f.name}" for c, f in walk(Config) if not f.metadata.get("description")]
    assert missing == []


def test_shipped_configs_load():
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")):
        if not path.name.startswith("accelerate_"):
            load_config(path)


def test_upstream_with_credentials_is_refused():
    # aiohttp refuses a URL with user:password beside the client's Authorization header, so
    # every request would fail with a 500; say how to pass the key instead.
    with pytest.raises(ConfigError) as e:
        load_config(None, {"proxy.upstream": "https://user:sk-x@llm.example.com/v1"})
    assert "apiKey" in e.value.message and "sk-x" not in e.value.message
    assert load_config(None, {"proxy.upstream": "http://127.0.0.1:8000/v1"}).proxy.upstream == \
        "http://127.0.0.1:8000"


@pytest.mark.parametrize(("finetune", "device", "bf16_cpu", "want"), [
    ("lora", "cpu", True, "bfloat16"),
    ("lora", "cpu", False, "float32"),   # no bf16 instructions: emulated bf16 is slower than float32
    ("lora", "cuda", False, "bfloat16"),
    ("full", "cpu", True, "float32"),    # full fine-tuning's own weights stay float32
    ("full", "cuda", True, "float32"),
])
def test_trainer_dtype_auto(monkeypatch, finetune, device, bf16_cpu, want):
    import clawproxy.config

    monkeypatch.setattr(clawproxy.config, "cpu_has_bf16", lambda: bf16_cpu)
    cfg = load_config(None, {"trainer.finetune": finetune, "engine.device": device})
    assert cfg.trainer.dtype == want
    assert load_config(None, {"trainer.finetune": finetune, "trainer.dtype": "float32"}).trainer.dtype == "float32"


@pytest.mark.parametrize(("overrides", "bf16_cpu", "want"), [
    ({}, False, "w4a16"),                    # the default model on an AVX2 CPU: emulated bfloat16 loses
    ({}, True, "none"),                      # native bfloat16 (AVX512-BF16, AMX): served as it is
    ({"engine.device": "cuda"}, False, "none"),
    ({"engine.kind": "embedded"}, False, "none"),          # it serves unquantized weights only
    ({"trainer.finetune": "full"}, False, "none"),         # a full checkpoint cannot reload into 4 bits
    ({"engine.model": "smollm2-135m"}, False, "none"),     # served in float32: nothing emulated
    ({"engine.model": "Qwen/Qwen2.5-0.5B-Instruct"}, False, "none"),  # a hub id is not quantized here
    ({"engine.quantization": "none"}, False, "none"),
    ({"engine.quantization": "w4a16"}, True, "w4a16"),
])
def test_quantization_auto(monkeypatch, overrides, bf16_cpu, want):
    import clawproxy.config

    monkeypatch.setattr(clawproxy.config, "cpu_has_bf16", lambda: bf16_cpu)
    assert load_config(None, overrides).engine.quantization == want


def test_a_lora_adapter_trains_in_float32_on_a_bfloat16_model(tmp_path, tiny_model_dir):
    import torch

    from trainer.checkpoints import Version
    from trainer.policy import load_policy

    cfg = load_config(None, {"data_dir": str(tmp_path), "engine.model": str(tiny_model_dir),
                             "trainer.finetune": "lora", "trainer.dtype": "bfloat16"})
    model, _ = load_policy(cfg.trainer, tiny_model_dir, Version(0, tiny_model_dir, "full"))
    trained = {p.dtype for p in model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert trained == {torch.float32} and frozen == {torch.bfloat16}
