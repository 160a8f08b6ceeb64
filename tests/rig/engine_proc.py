"""Run the embedded engine as a real subprocess on a free loopback port (test helper)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.net import held_port, stop
from tests.waits import until_sync


@contextlib.contextmanager
def engine_process(model_dir: Path, data_dir: Path, *extra: str, timeout: float = 90.0) -> Iterator[str]:
    """Start ``python -m clawproxy.engine``; yield its base URL once /health answers 200."""
    with held_port() as port:
        yield from _engine_on(port, model_dir, data_dir, extra, timeout)


def _engine_on(port: int, model_dir: Path, data_dir: Path, extra: tuple[str, ...], timeout: float) -> Iterator[str]:
    log_path = data_dir / f"engine-{port}.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clawproxy.engine", "--kind", "embedded", "--model", str(model_dir), "--port", str(port),
             "--data-dir", str(data_dir), "--log-level", "WARNING", *extra],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"engine exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                return get(url + "/health", timeout=2).status_code == 200
            except OSError:
                return False

        until_sync(healthy, f"the engine to answer /health (log: {log_path})", timeout, poll=0.2)
        yield url
    finally:
        stop(proc, grace=15)


@dataclass
class Response:
    """The bits of an HTTP response the tests look at (stdlib only: no extra client library)."""

    status_code: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


def request(method: str, url: str, body: Any = None, raw: bytes | None = None,
            headers: dict[str, str] | None = None, timeout: float = 120) -> Response:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Response(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read().decode())
    except urllib.error.HTTPError as err:
        return Response(err.code, {k.lower(): v for k, v in err.headers.items()}, err.read().decode())


def get(url: str, timeout: float = 30) -> Response:
    return request("GET", url, timeout=timeout)


def chat(url: str, body: dict[str, Any], **kw: Any) -> Response:
    return request("POST", url + "/v1/chat/completions", body, **kw)


def stream_chat(
    url: str, body: dict[str, Any], on_chunk: Callable[[dict], None] | None = None
) -> tuple[list[dict], bool, dict[str, str]]:
    """POST a streamed chat completion; return (chunks, saw [DONE], response headers)."""
    chunks: list[dict] = []
    done = False
    req = urllib.request.Request(url + "/v1/chat/completions", method="POST",
                                 data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        headers = {k.lower(): v for k, v in r.headers.items()}
        for raw_line in r:
            line = raw_line.decode().rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            chunks.append(chunk)
            if on_chunk is not None:
                on_chunk(chunk)
    return chunks, done, headers


def forward_logprobs(model: Any, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    """Log-probs of ``completion_ids`` under ``model`` in one teacher-forced forward pass."""
    import torch

    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    start = len(prompt_ids) - 1
    return [float(lp[start + i, t]) for i, t in enumerate(completion_ids)]
