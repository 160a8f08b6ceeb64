"""``engine.kind: auto``: the engine chosen from faked machines, never from this CPU's flags."""

from __future__ import annotations

import pytest

import clawproxy.config
from clawproxy.config import load_config
from clawproxy.engine_choice import OVERRIDE, Machine, choose, cpu_flags

AVX2 = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi2".split())
AVX512_BF16 = AVX2 | {"avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}
AMX = AVX512_BF16 | {"amx_bf16", "amx_tile", "amx_int8"}
EVERYTHING = {"vllm": True, "llamacpp": True}


@pytest.mark.parametrize(("flags", "gpu", "installed", "kind", "says"), [
    (AVX2, False, EVERYTHING, "llamacpp", "no native bfloat16"),
    (AVX512_BF16, False, EVERYTHING, "vllm", "natively (avx512_bf16)"),
    (AMX, False, EVERYTHING, "vllm", "natively (amx_bf16, avx512_bf16)"),
    (AVX2, True, EVERYTHING, "vllm", "a GPU"),
    (AMX, True, EVERYTHING, "vllm", "a GPU"),
    # what is missing decides next
    (AVX2, False, {"vllm": True, "llamacpp": False}, "vllm", "llama.cpp cannot be built here"),
    (AMX, False, {"vllm": False, "llamacpp": True}, "llamacpp", "no vLLM build"),
    (AVX2, True, {"vllm": False, "llamacpp": True}, "embedded", "no vLLM build"),
    (AVX2, False, {"vllm": False, "llamacpp": False}, "embedded", "neither"),
    (AVX512_BF16, False, {"vllm": False, "llamacpp": False}, "embedded", "neither"),
    (frozenset(), False, EVERYTHING, "llamacpp", "no native bfloat16"),  # no /proc/cpuinfo
])
def test_the_engine_chosen_for_each_machine(flags, gpu, installed, kind, says):
    choice = choose(Machine(cpu_flags=flags, gpu=gpu, **installed))
    assert choice.kind == kind
    assert says in choice.reason
    line = choice.line()
    assert line.startswith(f"engine: {kind} (") and OVERRIDE in line and "\n" not in line


def test_cpu_flags_are_read_from_cpuinfo():
    cpuinfo = ("processor\t: 0\nflags\t\t: fpu avx2 avx512_bf16\n\nprocessor\t: 1\n"
               "flags\t\t: fpu avx2 avx512_bf16 amx_bf16\nmodel name\t: x\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_bf16", "amx_bf16"}
    assert cpu_flags("Features\t: fp asimd bf16\n") == {"fp", "asimd", "bf16"}  # arm64
    assert cpu_flags("") == frozenset()


def _on(monkeypatch, flags, **installed):
    machine = Machine(cpu_flags=flags, gpu=False, **{**EVERYTHING, **installed})
    monkeypatch.setattr(clawproxy.config, "this_machine", lambda device: machine)
    monkeypatch.setattr(clawproxy.config, "cpu_has_bf16", lambda: "avx512_bf16" in flags)


def test_auto_is_the_default_and_serves_llamacpp_4_bits_on_an_avx2_cpu(monkeypatch):
    _on(monkeypatch, AVX2)
    cfg = load_config(None)
    assert cfg.engine.kind == "llamacpp" and cfg.engine.auto_choice is not None
    assert cfg.engine.auto_choice.kind == "llamacpp"
    assert cfg.engine.quantization == "q4_k_m"  # the catalog's file: no w4a16 weights are made
    assert cfg.engine.spec.built_on_first_start


def test_auto_keeps_vllm_unquantized_on_a_bf16_cpu(monkeypatch):
    _on(monkeypatch, AVX512_BF16)
    cfg = load_config(None)
    assert (cfg.engine.kind, cfg.engine.quantization) == ("vllm", "none")
    assert not cfg.engine.spec.built_on_first_start


def test_auto_falls_back_to_vllm_w4a16_where_llamacpp_cannot_build(monkeypatch):
    _on(monkeypatch, AVX2, llamacpp=False)
    cfg = load_config(None)
    assert (cfg.engine.kind, cfg.engine.quantization) == ("vllm", "w4a16")


@pytest.mark.parametrize("kind", ["vllm", "llamacpp", "embedded"])
def test_a_named_engine_is_not_chosen(monkeypatch, kind):
    _on(monkeypatch, AVX2)
    cfg = load_config(None, {"engine.kind": kind})
    assert cfg.engine.kind == kind and cfg.engine.auto_choice is None


def test_the_run_config_names_the_chosen_engine(monkeypatch, tmp_path):
    from clawproxy.supervisor import _write_run_config

    _on(monkeypatch, AVX2)
    path = _write_run_config(load_config(None, {"data_dir": str(tmp_path)}))
    _on(monkeypatch, AMX)  # a child reads the engine the supervisor chose, not the machine again
    again = load_config(path)
    assert (again.engine.kind, again.engine.quantization) == ("llamacpp", "q4_k_m")
    assert again.engine.auto_choice is None
