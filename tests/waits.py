"""Waiting in tests on what the code exposes, never for a fixed time.

``until`` waits, with a deadline, for a condition the code makes observable (a counter, a state, an
event a fake sets); ``until_sync`` is the same for synchronous tests. ``assert_stays`` is the one
honest use of a window: something that must NOT happen does not happen for ``window`` seconds; each
caller names the window and says why it is long enough.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

_POLL_S = 0.005
_POLL_SYNC_S = 0.05  # a synchronous check mostly asks another process (HTTP, SQLite, /proc): rarer


async def until(check: Callable[[], Any], what: str, timeout: float = 10.0,
                poll: float = _POLL_S) -> Any:
    """Until ``check()`` is true (awaited if it is a coroutine), returning its value; fails naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(poll)


def until_sync(check: Callable[[], Any], what: str, timeout: float = 10.0,
               poll: float = _POLL_SYNC_S) -> Any:
    """``until`` for synchronous tests (a subprocess, another thread, a server polled over HTTP)."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)
    return value


async def assert_stays(check: Callable[[], object], what: str, window: float) -> None:
    """``check()`` holds throughout the next ``window`` seconds (checked as often as ``until``)."""
    deadline = time.monotonic() + window
    while True:
        assert check(), f"{what}: stopped holding within {window:g} s"
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(_POLL_S)


def assert_stays_sync(check: Callable[[], object], what: str, window: float, poll: float = _POLL_SYNC_S) -> None:
    """``assert_stays`` for synchronous tests (a browser driven by selenium, a subprocess)."""
    deadline = time.monotonic() + window
    while True:
        assert check(), f"{what}: stopped holding within {window:g} s"
        if time.monotonic() >= deadline:
            return
        time.sleep(poll)
