"""Start and stop a whole `clawproxy start` (proxy, engine, judge, trainer) for a simulation run.

The benchmark and `clawproxy simulate --start` need a system they own: a fresh data dir, loopback
ports held for it from the start, and the method/finetune/oracle switches applied as config
overrides. The config is
written to the data dir and passed with --config, so every child sees the same settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from clawproxy.errors import ClawproxyError
from clawproxy.httpjson import answers_ok


def _hold_port(stack: contextlib.ExitStack) -> int:
    """A loopback port bound, never listening, until ``stack`` closes: no other process can take
    it before our child listens on it (aiohttp binds with SO_REUSEADDR, which a bound but idle
    socket allows on Linux)."""
    s = stack.enter_context(socket.socket())
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class System:
    """A supervised `clawproxy start` in its own process group, stopped on exit."""

    def __init__(self, data_dir: str | Path, overrides: dict[str, Any] | None = None,
                 config_path: str | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.overrides = dict(overrides or {})
        self.config_path = config_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._ports = contextlib.ExitStack()
        self.proxy_port = _hold_port(self._ports)
        self.engine_port = _hold_port(self._ports)
        self.config: Any = None
        self.api_key: str | None = None  # a user's key: once the store has users, /v1 needs one

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.engine_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "logs" / "simulate-start.log"

    def write_config(self) -> Path:
        import yaml

        from clawproxy.config import load_config

        over = {"proxy.host": "127.0.0.1", "proxy.port": self.proxy_port,
                "engine.host": "127.0.0.1", "engine.port": self.engine_port,
                "data_dir": str(self.data_dir), **self.overrides}
        self.config = load_config(self.config_path, over)
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.data_dir / "simulate-config.yaml"
        path.write_text(yaml.safe_dump(dataclasses.asdict(self.config), sort_keys=False))
        return path

    def start(self, timeout_s: float = 900.0) -> System:
        cfg_path = self.write_config()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        argv = [sys.executable, "-m", "clawproxy.cli", "start", "--config", str(cfg_path),
                "--data-dir", str(self.data_dir)]
        self.proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        logf.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._ports.close()
                raise ClawproxyError(
                    f"clawproxy start exited with {self.proc.returncode}; see {self.log_path}:\n"
                    + self.log_tail())
            if answers_ok(self.engine_url + "/health", 3) and answers_ok(self.proxy_url + "/v1/models", 3, self.api_key):
                return self
            time.sleep(1.0)
        self.stop()
        raise ClawproxyError(f"clawproxy start not ready after {timeout_s:.0f}s; see {self.log_path}")

    def log_tail(self, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    def stop(self, grace_s: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._ports.close()
            return
        # SIGTERM to the supervisor only: it stops its own children (they are in their own groups).
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._ports.close()

    def __enter__(self) -> System:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
