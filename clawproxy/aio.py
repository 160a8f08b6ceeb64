"""The event loop the proxy and the supervisor run on: uvloop when it is installed (Linux and
macOS wheels; `pip install clawproxy` brings it), the standard asyncio loop otherwise or when
``CLAWPROXY_EVENT_LOOP=asyncio`` asks for it. uvloop's socket and transport layer is C, which
matters to a proxy that relays every streamed chunk (figures: bench/proxy_overhead.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None for asyncio's default."""
    choice = os.environ.get("CLAWPROXY_EVENT_LOOP", "auto").lower()
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            from clawproxy.errors import ConfigError

            raise ConfigError("CLAWPROXY_EVENT_LOOP=uvloop but uvloop is not installed; "
                              "`pip install uvloop` or unset it.") from None
        return None
    return uvloop.new_event_loop


def new_event_loop() -> asyncio.AbstractEventLoop:
    factory = loop_factory()
    return factory() if factory else asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the chosen loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)


def loop_name() -> str:
    factory = loop_factory()
    return "uvloop" if factory else "asyncio"
