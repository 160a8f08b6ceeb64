"""`clawproxy start` before the supervisor runs: the engine it chose and why, and the first start's
llama-server build, with progress, beside the model's download. The machine is faked, nothing is
built or downloaded, and the supervisor is not started."""

from __future__ import annotations

import threading

import pytest
from click.testing import CliRunner

import clawproxy.cli
import clawproxy.config
from clawproxy import catalog, models_cli, supervisor
from clawproxy.engine.llamacpp import build as llamacpp_build
from clawproxy.engine_choice import Machine
from clawproxy.errors import ConfigError

AVX2 = frozenset({"avx", "avx2", "fma"})


@pytest.fixture
def first_start(monkeypatch, tmp_path):
    """An AVX2 machine with nothing built or fetched yet; returns what happened, in order."""
    events: list[str] = []
    building, fetched = threading.Event(), threading.Event()
    machine = Machine(cpu_flags=AVX2, gpu=False, vllm=True, llamacpp=True)
    monkeypatch.setattr(clawproxy.config, "this_machine", lambda device: machine)
    monkeypatch.setattr(clawproxy.config, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(llamacpp_build, "find", lambda cache=None: None)

    def build(echo=True, progress=None, log_path=None, **_):
        building.set()
        progress(1, 10)
        assert fetched.wait(60), "the build did not run while the model downloaded"
        progress(10, 10)
        events.append("built")

    def fetch(name):
        assert building.wait(60), "the build did not start before the download"
        events.append(f"fetched {name}")
        fetched.set()

    monkeypatch.setattr(llamacpp_build, "build", build)
    monkeypatch.setattr(catalog, "is_converted", lambda model, out: False)
    monkeypatch.setattr(models_cli, "fetch_in_terminal", fetch)
    monkeypatch.setattr(clawproxy.cli, "_quantize_in_terminal", lambda *a: pytest.fail("w4a16 weights made"))
    monkeypatch.setattr(supervisor, "run", lambda cfg: events.append(f"run {cfg.engine.kind} {cfg.engine.quantization}"))
    return events, ["start", "--data-dir", str(tmp_path / "d"), "--port", "18999"]


def test_an_avx2_first_start_builds_llama_server_beside_the_download(first_start):
    events, args = first_start
    r = CliRunner().invoke(clawproxy.cli.main, args)
    assert r.exit_code == 0, r.output
    assert events == ["fetched qwen2.5-coder-1.5b", "built", "run llamacpp q4_k_m"]
    lines = r.output.splitlines()
    said = [ln for ln in lines if ln.startswith("engine: ")]
    assert len(said) == 1 and "llamacpp" in said[0] and "no native bfloat16" in said[0] and "--engine" in said[0]
    # not a terminal: lines, not a bar's control codes
    steps = [ln for ln in lines if ln.startswith("building llama-server: ")]
    assert steps[-1] == "building llama-server: 10/10" and "\x1b" not in r.output
    assert any("llama-server built in" in ln for ln in lines)


def test_steps_print_a_line_each_tenth_where_stderr_is_not_a_terminal(capsys):
    from clawproxy.cli_options import steps

    with steps("building") as update:
        for done in range(1, 301):
            update(done, 300)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "building: 1/300" and lines[-1] == "building: 300/300" and len(lines) == 11


def test_a_forced_engine_is_not_announced_and_builds_nothing(first_start, monkeypatch):
    events, args = first_start
    monkeypatch.setattr(llamacpp_build, "build", lambda **_: pytest.fail("built"))
    monkeypatch.setattr(models_cli, "fetch_in_terminal", lambda name: events.append("fetched"))
    monkeypatch.setattr(clawproxy.cli, "_quantize_in_terminal", lambda *a: events.append("w4a16 made"))
    r = CliRunner().invoke(clawproxy.cli.main, [*args, "--engine", "vllm"])
    assert r.exit_code == 0, r.output
    assert not [ln for ln in r.output.splitlines() if ln.startswith("engine: ")]
    assert events == ["fetched", "w4a16 made", "run vllm w4a16"]  # vLLM on this CPU: 4 bits, as before auto


def test_a_failed_build_stops_the_start_with_what_to_install(first_start, monkeypatch):
    events, args = first_start

    def broken(**_):
        raise ConfigError("building llama-server needs cmake on PATH; install cmake, ninja and a C++17 compiler")

    monkeypatch.setattr(llamacpp_build, "build", broken)
    monkeypatch.setattr(models_cli, "fetch_in_terminal", lambda name: events.append("fetched"))
    r = CliRunner().invoke(clawproxy.cli.main, args)
    assert r.exit_code == 1 and "install cmake, ninja and a C++17 compiler" in r.output
    assert not [e for e in events if e.startswith("run")]
