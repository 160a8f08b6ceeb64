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


@pytest.mark.parametrize("yaml_text, key", [
    ("proxy:\n  port: 80a\n", "config.proxy.port"),
    ("sessions:\n  idle_timeout_s: soon\n", "config.sessions.idle_timeout_s"),
    ("proxy:\n  record_tokens: maybe\n", "config.proxy.record_tokens"),
])
def test_wrong_type_names_the_key(tmp_path, yaml_text, key):
    p = tmp_path / "c.yaml"
    p.write_text(yaml_text)
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert key in e.value.message


def test_upstream_with_credentials_is_refused():
    # aiohttp refuses a URL with user:password beside the client's Authorization header, so
    # every request would fail with a 500; say how to pass the key instead.
    with pytest.raises(ConfigError) as e:
        load_config(None, {"proxy.upstream": "https://user:sk-x@llm.example.com/v1"})
    assert "apiKey" in e.value.message and "sk-x" not in e.value.message
    assert load_config(None, {"proxy.upstream": "http://127.0.0.1:8000/v1"}).proxy.upstream == \
        "http://127.0.0.1:8000"
