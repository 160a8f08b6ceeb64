"""A proxy and a fake upstream as real processes, driven with raw sockets (reliability tests, bench).

Raw sockets, because the reliability checks send what a well-behaved client library will not:
bodies shorter than their Content-Length, header bytes that are not UTF-8, arbitrary paths.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.net import held_port
from tests.waits import until_sync

REPO = Path(__file__).resolve().parents[2]
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


_HELD = contextlib.ExitStack()


def free_port() -> int:
    """A loopback port held (bound, never listening) for the rest of the session: no other bind
    takes it, while our servers (SO_REUSEADDR) can still listen on it."""
    return _HELD.enter_context(held_port())


def _env() -> dict[str, str]:
    # Children import this checkout's code, whatever the venv's editable install points at.
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


class FakeProc:
    """``python -m tests.rig.fake_upstream`` on a free port."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.rig.fake_upstream", "--port", "0"],
                                     cwd=REPO, env=_env(), stdout=subprocess.PIPE, text=True,
                                     stderr=subprocess.DEVNULL)  # its tracebacks when a proxy is killed
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("PORT "), line
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class ProxyProc:
    """``python -m clawproxy.proxy`` with its log in ``<data>/proxy.log``; restartable, killable."""

    def __init__(self, upstream: str, data: Path, *args: str) -> None:
        self.upstream, self.data, self.args = upstream, data, args
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = data.parent / f"{data.name}-proxy.log"

    def start(self, timeout: float = 30.0) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "clawproxy.proxy", "--upstream", self.upstream, "--port",
                 str(self.port), "--data-dir", str(self.data), "--log-level", "INFO", *self.args],
                cwd=REPO, env=_env(), stdout=logf, stderr=subprocess.STDOUT)
        proc = self.proc

        def up() -> bool:
            try:
                self.get("/clawproxy/health")
                return True
            except OSError:
                if proc.poll() is not None:
                    raise AssertionError(f"proxy did not start: {self.log.read_text()[-3000:]}") from None
                return False

        until_sync(up, f"the proxy to answer /clawproxy/health (log: {self.log})", timeout)

    def get(self, path: str) -> dict[str, Any]:
        with _OPENER.open(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
            return json.loads(r.read())

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(20)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill(signal.SIGTERM)

    def wait_idle(self, timeout: float = 30.0) -> dict[str, Any]:
        """Stats once the recorder's queue is empty and nothing is in flight."""
        last: list[tuple] = [()]  # the counts at the previous poll

        def idle() -> dict[str, Any] | None:
            s = self.get("/clawproxy/stats")
            key = (s["turns_recorded"], s["quarantined"], s["spool_records"], s["turns_lost"])
            settled = s["queue_depth"] == 0 and s["in_flight"] == 0 and key == last[0]
            last[0] = key
            return s if settled else None

        return until_sync(idle, "the recorder to go idle", timeout, poll=0.15)


def raw_request(port: int, data: bytes, timeout: float = 10.0, half_close: bool = False,
                ) -> tuple[int | None, bytes]:
    """Send ``data`` as is; (status or None when no response came, whole response bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                b = s.recv(65536)
                if not b:
                    break
                chunks.append(b)
        except (TimeoutError, ConnectionResetError):
            pass
    out = b"".join(chunks)
    try:
        return int(out.split(b" ", 2)[1]), out
    except (IndexError, ValueError):
        return None, out


def http_request(method: str, path: bytes, body: bytes = b"",
                 headers: list[tuple[bytes, bytes]] | None = None) -> bytes:
    """One HTTP/1.1 request with Connection: close, headers exactly as given."""
    lines = [method.encode() + b" " + path + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close",
             b"Content-Length: " + str(len(body)).encode()]
    lines += [k + b": " + v for k, v in headers or []]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def raw_header(data: bytes) -> tuple[bytes, bytes]:
    """The fake upstream's x-fake-raw header: stream ``data`` verbatim."""
    return b"x-fake-raw", base64.b64encode(data)


def chat_body(text: str, stream: bool = True, **extra: Any) -> bytes:
    return json.dumps({"model": "m", "stream": stream,
                       "messages": [{"role": "user", "content": text}], **extra}).encode()


def stream_until_done(port: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None,
                      timeout: float = 30.0) -> bytes:
    """POST a streamed chat request and return as soon as ``[DONE]`` has arrived (socket open)."""
    req = http_request("POST", b"/v1/chat/completions", body,
                       [(b"Content-Type", b"application/json"), *(headers or [])])
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(req)
        buf = b""
        while b"data: [DONE]" not in buf:
            b = s.recv(65536)
            if not b:
                raise AssertionError(f"stream ended without [DONE]: {buf[-500:]!r}")
            buf += b
        return buf
    finally:
        s.close()


def store_texts(db: Path) -> list[str]:
    from clawproxy.store import Store

    st = Store(db)
    try:
        return [r["response_text"] or "" for r in st.query("SELECT response_text FROM turns")]
    finally:
        st.close()


def store_counts(db: Path) -> tuple[int, int]:
    """(turns, quarantined) in the store."""
    from clawproxy.store import Store

    st = Store(db)
    try:
        return (st.query_one("SELECT COUNT(*) AS n FROM turns")["n"], st.quarantine_count())
    finally:
        st.close()
