"""Loopback ports for tests and benchmarks: no test picks a port, lets it go and hopes it is still
free, and none sleeps in the hope that a server is up."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator

from tests.waits import until


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


async def wait_ok(url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Until GET ``url`` answers 200: a server started in another process is ready. Fails early,
    with its output, when ``proc`` exits first."""
    import aiohttp

    async with aiohttp.ClientSession() as client:
        async def answers() -> bool:
            try:
                async with client.get(url) as r:
                    if r.status == 200:
                        return True
            except aiohttp.ClientError:
                pass
            if proc is not None and proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else b""
                raise RuntimeError(f"{url}: the server exited with {proc.returncode}: {out!r}")
            return False

        await until(answers, f"{url} to answer 200", timeout, poll=0.1)


def stop(proc: subprocess.Popen, grace: float = 60) -> None:
    """Terminate ``proc`` (if still running), killing it when it outlives ``grace`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
