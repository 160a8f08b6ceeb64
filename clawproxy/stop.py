"""A stop that a signal handler may set: a flag and a self-pipe, no lock.

Python runs a signal handler on the main thread between two bytecodes, so a handler that takes a
lock the main thread may hold deadlocks for good. ``threading.Event.set()`` does: it takes the
event's condition lock, which ``Event.wait()`` holds on the main thread on its way in and out of
its sleep (a judge child found this way still polled 85 minutes after its supervisor died, deaf to
SIGTERM). :class:`Stop` is set by a plain assignment and a non-blocking write to a pipe; ``wait``
sleeps in ``select`` on that pipe, which the write wakes. Use :func:`on_signals` in every command
that runs as a child.
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Stoppable(Protocol):
    """What a poll loop asks of its stop: a ``threading.Event`` or a :class:`Stop`."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Stop:
    """Set once, from anywhere, signal handlers included; waited on like ``threading.Event``."""

    def __init__(self) -> None:
        self._set = False
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)

    def set(self) -> None:
        self._set = True
        try:
            os.write(self._w, b"\0")
        except OSError:  # a full pipe already wakes every wait; a closed one has no waiter left
            pass

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        if not self._set:
            select.select([self._r], [], [], timeout)  # the pipe is never drained: once set, no wait sleeps
        return self._set

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


@contextmanager
def on_signals(*signums: int) -> Iterator[Stop]:
    """A :class:`Stop` set by ``signums`` (default SIGTERM and SIGINT) while the block runs; the
    previous handlers come back after it."""
    stop = Stop()

    def handler(_signum: int, _frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signums or (signal.SIGTERM, signal.SIGINT))}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        stop.close()


@contextmanager
def terminate_unwinds() -> Iterator[None]:
    """SIGTERM raises ``SystemExit(143)`` on the main thread while the block runs, so its ``finally``
    blocks (and ``asyncio.run``'s cancellation) run: by default SIGTERM ends Python at once, and a
    command that started a system would leave it running."""
    def handler(_signum: int, _frame: object) -> None:
        raise SystemExit(128 + signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
