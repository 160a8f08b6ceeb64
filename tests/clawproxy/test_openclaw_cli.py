"""`clawproxy openclaw-config`: the provider block read from the served model, flags, --write."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from clawproxy.cli import main


@pytest.fixture
def vllm_url():
    """A fake vLLM on loopback serving Qwen/Qwen3-4B with a 4096-token context."""
    import asyncio
    import threading

    from aiohttp import web

    from tests.fakes.fake_vllm import create_fake_vllm
    from tests.net import held_port

    with held_port() as port:
        loop = asyncio.new_event_loop()
        runner = web.AppRunner(create_fake_vllm(model="Qwen/Qwen3-4B", api_key="sk-up"))
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            loop.run_until_complete(runner.cleanup())
            loop.close()


def _block(output: str) -> dict:
    return json.loads(output[output.index("\n{") + 1:])


def test_openclaw_config_reads_the_served_context(vllm_url):
    r = CliRunner().invoke(main, ["openclaw-config", "--port", "9123", "--upstream", vllm_url,
                                  "--api-key", "sk-up"])
    assert r.exit_code == 0, r.output
    block = _block(r.stdout)
    prov = block["models"]["providers"]["clawproxy"]
    assert prov["baseUrl"] == "http://127.0.0.1:9123/v1" and prov["api"] == "openai-completions"
    # OpenClaw waits as long as the proxy does: a CPU's first token on a long prompt takes minutes
    from clawproxy.config import ProxyConfig

    assert prov["timeoutSeconds"] >= ProxyConfig().read_timeout_s
    model = prov["models"][0]
    assert model["id"] == "Qwen/Qwen3-4B" and model["contextWindow"] == 4096
    assert model["compat"] == {"sendSessionAffinityHeaders": True, "supportsTools": False}
    assert block["agents"]["defaults"]["model"]["primary"] == "clawproxy/Qwen/Qwen3-4B"
    # 4096 tokens hold only the tool-less profile, and the comment says so
    assert "// profile 'chat'" in r.stdout and "max_model_len of" in r.stdout


def test_openclaw_config_flags_override_and_warn(vllm_url):
    r = CliRunner().invoke(main, ["openclaw-config", "--upstream", vllm_url, "--api-key", "sk-up",
                                  "--context-window", "3000", "--profile", "default",
                                  "--max-tokens", "300", "--temperature", "0.3"])
    assert r.exit_code == 0, r.output
    block = _block(r.stdout)
    model = block["models"]["providers"]["clawproxy"]["models"][0]
    assert model["contextWindow"] == 3000 and model["maxTokens"] == 300
    assert "tools" not in block  # OpenClaw's defaults
    assert block["agents"]["defaults"]["models"]["clawproxy/Qwen/Qwen3-4B"]["params"] == {"temperature": 0.3}
    assert "below OpenClaw's minimum" in r.stderr and "WARNING" in r.stdout


def test_openclaw_config_write_merges_and_keeps_a_backup(vllm_url, tmp_path):
    path = tmp_path / "openclaw.json"
    path.write_text("""// mine
{
  gateway: {mode: "local"},
  models: {providers: {clawproxy: {baseUrl: "http://old/v1", models: [{id: "old"}]}, other: {baseUrl: "x"}}},
}
""")
    r = CliRunner().invoke(main, ["openclaw-config", "--upstream", vllm_url, "--api-key", "sk-up",
                                  "--context-window", "32768", "--write"],
                           env={"OPENCLAW_CONFIG_PATH": str(path)})
    assert r.exit_code == 0, r.output
    merged = json.loads(path.read_text())
    assert merged["gateway"] == {"mode": "local"}
    assert merged["models"]["providers"]["other"] == {"baseUrl": "x"}
    (model,) = merged["models"]["providers"]["clawproxy"]["models"]
    assert model["id"] == "Qwen/Qwen3-4B" and model["contextWindow"] == 32768
    assert "tools" not in merged  # 32k holds OpenClaw's default prompt
    (backup,) = tmp_path.glob("openclaw.json.bak-*")
    assert backup.read_text().startswith("// mine")
    assert (path.stat().st_mode & 0o777) == 0o600

    path.write_text("{not json5")
    r = CliRunner().invoke(main, ["openclaw-config", "--upstream", vllm_url, "--api-key", "sk-up",
                                  "--write"], env={"OPENCLAW_CONFIG_PATH": str(path)})
    assert r.exit_code != 0 and "not valid JSON5" in r.output


def test_openclaw_config_without_a_server_says_how_to_fix_it(tmp_path):
    from tests.net import held_port

    with held_port() as port:
        r = CliRunner().invoke(main, ["openclaw-config", "--port", str(port)])
    assert r.exit_code != 0 and "start clawproxy first" in r.output and "--context-window" in r.output


