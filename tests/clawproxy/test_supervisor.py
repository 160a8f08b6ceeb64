"""`clawproxy start` end to end: real processes, the real vLLM serving the tiny model, the official openai SDK."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from clawproxy.store import Store
from tests.net import held_port, stop
from tests.rig.vllm_engine import engine_settings, require_vllm
from tests.waits import until_sync


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def descendants_of(pid: int) -> list[int]:
    kids = children_of(pid)
    return kids + [d for k in kids for d in descendants_of(k)]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); read its state
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def wait_http(url: str, timeout: float = 120.0, want: int = 200) -> None:
    """Poll ``url`` until it answers ``want``. Only "not up yet" is retried (refused, reset, timed
    out, another status); anything else is a bug in the test or the server and raises at once."""
    def answers() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == want
        except urllib.error.HTTPError as e:
            return e.code == want
        except OSError:  # URLError, ConnectionError, TimeoutError: not listening yet
            return False

    until_sync(answers, f"{url} to answer {want}", timeout, poll=0.3)


MODEL = "tiny"


@dataclass
class Stack:
    proc: subprocess.Popen
    port: int
    engine_port: int
    data: Path
    out: Path  # the supervisor's stdout and stderr


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_vllm_model_dir) -> Iterator[Stack]:
    """`clawproxy start` with the real vLLM serving the tiny model, no judge, no trainer. Starting
    vLLM takes a minute on a 2-core CPU, under this fixture's own deadline, so the two tests below
    share it: the engine-crash test leaves it serving again, the next one stops it."""
    require_vllm()
    root = tmp_path_factory.mktemp("supervisor")
    data, config, out = root / "data", root / "config.yaml", root / "clawproxy.out"
    config.write_text(yaml.safe_dump({"engine": engine_settings(
        tiny_vllm_model_dir, served_model_name=MODEL, max_model_len=512, threads=1)}))
    with held_port() as port, held_port() as engine_port, open(out, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clawproxy.cli", "start", "--config", str(config), "--port", str(port),
             "--engine-port", str(engine_port), "--data-dir", str(data), "--no-judge", "--no-train"],
            stdout=log, stderr=subprocess.STDOUT, text=True,
        )
        try:
            try:
                wait_http(f"http://127.0.0.1:{port}/v1/models", timeout=600)  # 200 once vLLM is up
            except AssertionError as e:
                raise AssertionError(f"{e}\n{out.read_text()[-2000:]}\n{_engine_log(data)}") from None
            yield Stack(proc, port, engine_port, data, out)
        finally:
            stop(proc)


def _engine_log(data: Path) -> str:
    log = data / "logs" / "engine.log"
    return log.read_text()[-3000:] if log.exists() else ""


@dataclass
class Crash:
    status: int  # what a request got at once, after the supervisor saw the engine die
    body: bytes
    answered_s: float
    family: list[int]  # the engine's own processes (vLLM's engine core, its worker)
    left: list[int]  # those still alive once the restarted engine serves


@pytest.fixture
def crashed(stack) -> Iterator[Crash]:
    """The engine SIGKILLed by its pid, as the supervisor sees it; what a request gets at once, then
    the restarted engine serving through the proxy again, waited for here, under this fixture's own
    deadline: a vLLM restart can take most of the 120 s a test body gets."""
    (engine_pid,) = children_of(stack.proc.pid)
    family = descendants_of(engine_pid)
    os.kill(engine_pid, signal.SIGKILL)
    log = stack.data / "logs" / "clawproxy.log"  # written after the supervisor marks the engine not ready
    until_sync(lambda: "engine exited with code -9" in log.read_text(), "the supervisor saw the engine die", 60)
    req = urllib.request.Request(
        f"http://127.0.0.1:{stack.port}/v1/chat/completions",
        data=json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode(),
        headers={"content-type": "application/json"},
    )
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    answered = time.monotonic() - t0

    def serves() -> bool:  # 503 until the supervisor's readiness probe sees the new engine
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status == 200
        except urllib.error.HTTPError as e:
            assert e.code == 503, e.code
            return False

    until_sync(serves, "the restarted engine serves through the proxy", 600)
    left = [p for p in family if alive(p)]
    yield Crash(status, body, answered, family, left)
    for pid in left:  # ours: a failing run does not leave them holding the model's memory
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_engine_crash_gives_503_then_recovers(crashed):
    assert crashed.status == 503, "expected 503 while the engine restarts"
    assert b'"error"' in crashed.body
    assert crashed.answered_s < 2, "answered at once, did not hang"
    assert crashed.family and crashed.left == [], "the dead engine's vLLM processes went with it"


def test_start_serves_records_and_stops_cleanly(stack):
    from openai import OpenAI

    proc = stack.proc
    client = OpenAI(base_url=f"http://127.0.0.1:{stack.port}/v1", api_key="sk-test")
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi."}], stream=True,
        max_tokens=8, extra_headers={"session_id": "s-sup:0"},
    )
    chunks = list(stream)
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
    kids = children_of(proc.pid)
    assert kids, "the engine runs as a child process"
    family = descendants_of(proc.pid)  # vLLM's own processes (its engine core) included

    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    out = stack.out.read_text()
    assert proc.returncode == 0, out
    assert not [k for k in family if alive(k)], "no orphaned children"
    turns = Store(stack.data / "clawproxy.db").query("SELECT * FROM turns")
    said = [t for t in turns if "Say hi." in str(t["request_messages"])]  # not the crash test's turns
    assert len(said) == 1 and said[0]["session_id"] == "s-sup"


@pytest.mark.parametrize("flag", ["--port", "--engine-port"])
def test_taken_port_is_a_clear_error(tmp_path, flag):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with held_port() as port, held_port() as engine_port:
            ports = {"--port": port, "--engine-port": engine_port, flag: taken}
            r = subprocess.run(
                [sys.executable, "-m", "clawproxy.cli", "start", "--data-dir", str(tmp_path / "d"),
                 "--no-judge", "--no-train", "--model", str(tmp_path / "never-loaded"), "--engine", "vllm",
                 *[str(x) for kv in ports.items() for x in kv]],
                capture_output=True, text=True, timeout=60,
            )
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and flag in r.stderr and str(taken) in r.stderr, r.stderr


def test_every_child_starts_from_run_config_and_no_token_on_the_command_line(tmp_path):
    import stat

    from clawproxy.config import load_config
    from clawproxy.engine.__main__ import config_from_args, parse_args
    from clawproxy.supervisor import _write_run_config, build_children

    cfg = load_config(None, {"data_dir": str(tmp_path), "engine.max_model_len": 1024,
                             "engine.max_batch_size": 3, "engine.default_max_tokens": 64,
                             "engine.logprobs_mode": "processed_logprobs", "engine.threads": 2,
                             "engine.prefill_chunk_tokens": 64, "engine.prefix_cache_mb": 12.5,
                             "engine.rope_scaling": {"rope_type": "yarn", "factor": 2},
                             "engine.control_token": "s3cret"})
    run_config = _write_run_config(cfg)
    assert stat.S_IMODE(run_config.stat().st_mode) == 0o600
    engine, workers = build_children(cfg, run_config)
    assert engine is not None and [c.name for c in workers] == ["judge", "trainer"]
    for child in (engine, *workers):
        assert "s3cret" not in " ".join(child.argv)  # `ps` shows argv
        at = child.argv.index("--config")
        assert child.argv[at + 1] == str(run_config)
    seen = config_from_args(parse_args(engine.argv[3:]))  # what the engine process will load
    assert seen == cfg


def test_engine_flags_override_the_file_and_are_validated(tmp_path):
    from clawproxy.engine.__main__ import config_from_args, parse_args
    from clawproxy.errors import ConfigError

    cfg = config_from_args(parse_args(["--max-batch-size", "2", "--port", "0"]))
    assert (cfg.engine.max_batch_size, cfg.engine.port) == (2, 0)
    with pytest.raises(ConfigError, match="engine.max_batch_size"):
        config_from_args(parse_args(["--max-batch-size", "0"]))


def test_unusable_data_dir_is_a_clear_error(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with held_port() as port:
        r = subprocess.run(
            [sys.executable, "-m", "clawproxy.cli", "start", "--upstream", "http://127.0.0.1:9",
             "--port", str(port), "--data-dir", str(not_a_dir), "--no-judge", "--no-train"],
            capture_output=True, text=True, timeout=60,
        )
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "--data-dir" in r.stderr, r.stderr


def _plain_openai_server():
    """An OpenAI-compatible server that is not vLLM, as llama.cpp's or Ollama's: chat completions and
    models, nothing else (no /version, no /pause, no LoRA routes)."""
    import json

    from aiohttp import web

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "plain", "object": "model"}]})

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response({"id": "c1", "object": "chat.completion", "model": "plain", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "Hi there."}, "finish_reason": "stop"}]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for delta, finish in (({"role": "assistant", "content": "Hi"}, None), ({"content": " there."}, "stop")):
            chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "plain",
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def test_start_in_front_of_a_plain_openai_server_records_and_warns_once_that_the_trainer_is_off(tmp_path):
    from openai import OpenAI

    from tests.fakes.serve import serve_in_thread

    data = tmp_path / "data"
    with serve_in_thread(_plain_openai_server()) as upstream, held_port() as port:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clawproxy.cli", "start", "--upstream", upstream, "--port", str(port),
             "--data-dir", str(data), "--no-judge"],  # the trainer left on, as a user would
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/v1/models")
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test")
            chunks = list(client.chat.completions.create(
                model="plain", messages=[{"role": "user", "content": "Say hi."}], stream=True,
                extra_headers={"session_id": "s-plain:0"}))
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hi there."
            def recorded() -> int:
                store = Store.reader(data / "clawproxy.db")
                try:
                    return len(store.query("SELECT id FROM turns"))
                finally:
                    store.close()

            until_sync(lambda: recorded() == 1, "the turn is recorded", 60)
            assert not [k for k in children_of(proc.pid) if "train" in Path(f"/proc/{k}/cmdline").read_text()]
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=60)
    warnings = [line for line in out.splitlines() if "the trainer is off" in line]
    assert len(warnings) == 1 and "is not a vLLM" in warnings[0] and "--no-train" in warnings[0], out
    assert proc.returncode == 0 and "Traceback" not in out, out
