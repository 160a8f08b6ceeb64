"""How `clawproxy start` starts vLLM: the command and environment built from the config, and the
choices `auto` makes for a named model. (Starting it for real: test_vllm_real.py.)"""

from __future__ import annotations

import importlib.util

import pytest

from clawproxy.config import load_config
from clawproxy.engine.vllm.launch import require_vllm, server_command
from clawproxy.errors import ConfigError


def _cmd(**over):
    cfg = load_config(None, over)
    return cfg, *server_command(cfg.engine, cfg.trainer, "/models/x")


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_the_default_stack_serves_the_1_5b_in_bf16_with_lora_and_our_tool_parser():
    cfg, argv, env = _cmd()
    assert (cfg.engine.model, cfg.engine.dtype, cfg.trainer.finetune) == ("qwen2.5-coder-1.5b", "bfloat16", "lora")
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(argv, "--served-model-name") == "qwen2.5-coder-1.5b" and _flag(argv, "--dtype") == "bfloat16"
    assert "--enable-lora" in argv and _flag(argv, "--max-lora-rank") == "16"
    assert _flag(argv, "--tool-call-parser") == "qwen_fenced" and _flag(argv, "--tool-parser-plugin").endswith(
        "clawproxy/engine/vllm/tool_parsers.py")
    assert _flag(argv, "--logprobs-mode") == "raw_logprobs"
    assert "--enable-prompt-tokens-details" in argv  # recorded usage says how much the prefix cache held
    assert env["VLLM_SERVER_DEV_MODE"] == "1" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"  # vLLM's log lines reach engine.log when logged, not at exit
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "auto"  # default.yaml
    # a long prompt is prefilled in chunks, and a slow step does not make vLLM stop its engine
    assert _flag(argv, "--max-num-batched-tokens") == "512" and env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] == "3600"
    assert _flag(argv, "--block-size") == "32"  # a later session's shared prompt is cached to within 31 tokens
    assert "--block-size" not in _cmd(**{"engine.device": "cuda"})[1]  # GPUs keep vLLM's own (16)


def test_engine_vllm_args_override_the_step_bound():
    _, argv, _ = _cmd(**{"engine.vllm_args": ["--max-num-batched-tokens", "2048"]})
    flags = [i for i, a in enumerate(argv) if a == "--max-num-batched-tokens"]
    assert argv[flags[-1] + 1] == "2048"  # argparse keeps the last


def test_small_models_serve_in_float32_and_train_in_full():
    cfg, argv, _ = _cmd(**{"engine.model": "default"})
    assert (cfg.engine.dtype, cfg.trainer.finetune, cfg.engine.served_name) == ("float32", "full", "SmolLM2-135M-Instruct")
    assert "--enable-lora" not in argv
    cfg, _, _ = _cmd(**{"engine.model": "/some/dir/", "engine.device": "cuda"})
    assert (cfg.engine.dtype, cfg.trainer.finetune, cfg.engine.served_name) == ("bfloat16", "full", "dir")
    cfg, _, _ = _cmd(**{"engine.model": "Qwen/Qwen3-4B", "trainer.finetune": "lora", "trainer.lora_r": 24})
    assert cfg.engine.served_name == "Qwen/Qwen3-4B"


def test_lora_rank_takes_the_next_slot_vllm_accepts():
    _, argv, _ = _cmd(**{"trainer.finetune": "lora", "trainer.lora_r": 24})
    assert _flag(argv, "--max-lora-rank") == "32"


def test_token_threads_gpu_and_extra_flags():
    _, argv, env = _cmd(**{"engine.control_token": "s3cret", "engine.threads": 1, "engine.default_max_tokens": 256,
                           "engine.vllm_args": ["--enforce-eager"]})
    assert "s3cret" not in " ".join(argv) and env["VLLM_API_KEY"] == "s3cret"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(min(__import__("os").sched_getaffinity(0)))
    assert _flag(argv, "--override-generation-config") == '{"max_new_tokens": 256}'
    assert argv[-1] == "--enforce-eager"
    _, argv, env = _cmd(**{"engine.device": "cuda:1", "engine.gpu_memory_utilization": 0.5})
    assert _flag(argv, "--gpu-memory-utilization") == "0.5" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


@pytest.mark.parametrize("over, says", [
    ({"engine.threads": 4096}, "engine.threads"),
    ({"engine.device": "gpu"}, "engine.device"),
    ({"engine.kind": "sglang"}, "engine.kind"),
    ({"engine.dtype": "int8"}, "engine.dtype"),
])
def test_bad_engine_settings_are_refused_at_the_edge(over, says):
    with pytest.raises(ConfigError, match=says):
        load_config(None, over)


def test_no_vllm_installed_says_how_to_get_one(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ConfigError, match="make install.*engine.kind: embedded"):
        require_vllm()


def test_one_adapter_per_user_fits_vllms_lora_caches():
    _, argv, _ = _cmd()
    assert (_flag(argv, "--max-loras"), _flag(argv, "--max-cpu-loras")) == ("4", "16")
    _, argv, _ = _cmd(**{"engine.max_loras": 8, "engine.max_cpu_loras": 2})
    assert (_flag(argv, "--max-loras"), _flag(argv, "--max-cpu-loras")) == ("8", "8")
