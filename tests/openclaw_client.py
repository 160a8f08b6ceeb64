"""The real OpenClaw client, installed from the npm registry into a cache on first use.

``openclaw@2026.9.6`` needs Node >= 24.16 (<25) or >= 26.1. The node on PATH is used when it is
one of those; otherwise the npm ``node`` package, pinned, is installed beside it. Both live in
``$CLAWPROXY_OPENCLAW_CACHE`` (default ``~/.cache/clawproxy/openclaw``), so only the first run pays
for the download. Each run gets its own HOME and state dir: nothing touches the user's ~/.openclaw.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OPENCLAW_VERSION = "2026.9.6"
NODE_VERSION = "24.21.0"


def cache_dir() -> Path:
    return Path(os.environ.get("CLAWPROXY_OPENCLAW_CACHE",
                               Path.home() / ".cache" / "clawproxy" / "openclaw"))


def node_fits(node: str) -> bool:
    """True when ``node`` is a version openclaw's ``engines`` field accepts."""
    try:
        out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    m = re.match(r"v(\d+)\.(\d+)", out.strip())
    if not m:
        return False
    major, minor = int(m[1]), int(m[2])
    return (major == 24 and minor >= 16) or (major == 26 and minor >= 1) or major > 26


def _npm_install(prefix: Path, spec: str, path_env: str) -> None:
    npm = shutil.which("npm", path=path_env)
    if npm is None:
        raise RuntimeError("npm is not on PATH: install Node.js and npm (apt-get install npm), "
                           "then run the tests again.")
    prefix.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), spec],
                       capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PATH": path_env})
    if r.returncode != 0:
        raise RuntimeError(f"npm install {spec} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


@dataclass
class OpenClaw:
    """A runnable ``openclaw`` and the PATH its node needs."""

    bin: Path
    path_env: str

    def env(self, home: Path, config: Path | None = None) -> dict[str, str]:
        env = {**os.environ, "PATH": self.path_env, "HOME": str(home),
               "OPENCLAW_STATE_DIR": str(home / ".openclaw"), "NO_COLOR": "1"}
        if config is not None:
            env["OPENCLAW_CONFIG_PATH"] = str(config)
        return env

    def run(self, args: list[str], home: Path, config: Path | None = None,
            timeout: float = 900) -> dict[str, Any]:
        """Run ``openclaw ARGS`` (with --json among them) and return its JSON output."""
        home.mkdir(parents=True, exist_ok=True)
        r = subprocess.run([str(self.bin), *args], capture_output=True, text=True, timeout=timeout,
                           env=self.env(home, config), cwd=home)
        start = r.stdout.find("{")
        if r.returncode != 0 or start < 0:
            raise AssertionError(f"openclaw {' '.join(args)} exited {r.returncode}:\n"
                                 f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return json.loads(r.stdout[start:])


def ensure_openclaw() -> OpenClaw:
    """Install (once) and return the pinned OpenClaw client."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent test runs install once
        path_env = os.environ.get("PATH", "")
        node = shutil.which("node")
        if node is None or not node_fits(node):
            node_dir = root / f"node-{NODE_VERSION}"
            node_bin = node_dir / "node_modules" / ".bin"
            if not (node_bin / "node").exists() or not node_fits(str(node_bin / "node")):
                _npm_install(node_dir, f"node@{NODE_VERSION}", path_env)
            path_env = f"{node_bin}{os.pathsep}{path_env}"
        oc_dir = root / f"openclaw-{OPENCLAW_VERSION}"
        oc_bin = oc_dir / "node_modules" / ".bin" / "openclaw"
        if not oc_bin.exists():
            _npm_install(oc_dir, f"openclaw@{OPENCLAW_VERSION}", path_env)
        out = subprocess.run([str(oc_bin), "--version"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PATH": path_env})
        if OPENCLAW_VERSION not in out.stdout:
            raise RuntimeError(f"{oc_bin} --version said {out.stdout!r} {out.stderr[-500:]!r}")
        return OpenClaw(oc_bin, path_env)
