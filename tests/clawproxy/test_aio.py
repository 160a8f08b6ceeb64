"""The proxy's event loop: uvloop by default where installed, asyncio on request."""

from __future__ import annotations

import asyncio

import pytest

from clawproxy import aio
from clawproxy.errors import ConfigError


async def _which() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_by_default_and_asyncio_on_request(monkeypatch):
    pytest.importorskip("uvloop")
    monkeypatch.delenv("CLAWPROXY_EVENT_LOOP", raising=False)
    assert aio.loop_name() == "uvloop" and aio.run(_which()).startswith("uvloop")
    monkeypatch.setenv("CLAWPROXY_EVENT_LOOP", "asyncio")
    assert aio.loop_name() == "asyncio" and aio.run(_which()).startswith("asyncio")


def test_asking_for_a_missing_uvloop_says_how_to_fix_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "uvloop", None)  # import fails as if not installed
    monkeypatch.setenv("CLAWPROXY_EVENT_LOOP", "uvloop")
    with pytest.raises(ConfigError, match="pip install uvloop"):
        aio.loop_factory()
    monkeypatch.setenv("CLAWPROXY_EVENT_LOOP", "auto")
    assert aio.loop_factory() is None
