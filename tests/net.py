"""Loopback ports for tests: one helper, so no test picks a port, lets it go and hopes it is still free."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def held_port() -> Iterator[int]:
    """A loopback port that stays bound, never listening, while the block runs.

    No other bind can take it (not even another test's held_port), yet a server that binds with
    SO_REUSEADDR, as aiohttp, asyncio, the engine and torch's TCPStore do, can still listen on it;
    until one does, connections to it are refused (a dead upstream).
    """
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
