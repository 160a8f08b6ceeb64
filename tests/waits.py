"""Waiting in tests on what the code exposes, never for a fixed time.

``until`` waits, with a deadline, for a condition the code makes observable (a counter, a state, an
event a fake sets). ``assert_stays`` is the one honest use of a window: something that must NOT
happen does not happen for ``window`` seconds; each caller names the window and says why it is
long enough.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

_POLL_S = 0.005


async def until(check: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    """Until ``check()`` is true; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(_POLL_S)


async def assert_stays(check: Callable[[], object], what: str, window: float) -> None:
    """``check()`` holds throughout the next ``window`` seconds (checked as often as ``until``)."""
    deadline = time.monotonic() + window
    while True:
        assert check(), f"{what}: stopped holding within {window:g} s"
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(_POLL_S)


def assert_stays_sync(check: Callable[[], object], what: str, window: float, poll: float = 0.05) -> None:
    """``assert_stays`` for synchronous tests (a browser driven by selenium, a subprocess)."""
    deadline = time.monotonic() + window
    while True:
        assert check(), f"{what}: stopped holding within {window:g} s"
        if time.monotonic() >= deadline:
            return
        time.sleep(poll)
