"""A fake of vLLM's HTTP API, for what cannot run here (vLLM needs a GPU).

Faithful to vLLM's documented shapes (``vllm serve`` with ``VLLM_SERVER_DEV_MODE=1``), for the
routes clawproxy uses:
- ``GET /health``: 200 with an empty body.
- ``GET /v1/models``: model cards with ``max_model_len``.
- ``POST /v1/chat/completions``: a canned answer, streamed (role chunk, content chunks, finish
  chunk, optional ``choices: []`` usage chunk, ``data: [DONE]``) or not, with ``return_token_ids``
  (top-level ``prompt_token_ids``, ``choices[0].token_ids``) and ``logprobs``. Requests wait while
  the server is paused in keep/wait mode, as vLLM's scheduler holds them.
- dev-mode control (``vllm/entrypoints/serve/dev/rlhf/api_router.py``): ``POST /pause?mode=``
  -> ``{"status": "paused"}``, ``POST /resume`` -> ``{"status": "resumed"}``, ``GET /is_paused``
  -> ``{"is_paused": bool}``, ``POST /reset_prefix_cache`` (200, empty body),
  ``POST /collective_rpc`` ``{"method", "args", "kwargs"}`` -> ``{"results": [...]}`` (a failing
  worker call surfaces as a 500 error body).
- ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path", "load_inplace"}``: plain-text
  ``Success: LoRA adapter '<name>' added successfully.``; a 400 ``BadRequestError`` when the
  adapter is already loaded (without ``load_inplace``) or cannot be loaded.
- ``--api-key``: vLLM's middleware checks the bearer token only under ``/v1`` (dev routes are not
  guarded), so the fake does the same.

Every call is appended to ``app[CALLS]`` as ``(method, path_qs, json_body_or_None)`` so tests can
assert the exact sequence a client sends.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

CALLS = web.AppKey("calls", list)
STATE = web.AppKey("state", dict)

CANNED_TEXT = "Hello from fake vLLM."
CANNED_IDS = [9906, 505, 12700, 348, 4178, 44, 13]  # one id per canned piece below
CANNED_PIECES = ["Hello", " from", " fake", " v", "LL", "M", "."]


def _error(message: str, status: int, type_: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": type_, "param": None, "code": status}}, status=status
    )


def create_fake_vllm(
    model: str = "fake-model", api_key: str | None = None, dev_mode: bool = True
) -> web.Application:
    @web.middleware
    async def record_and_auth(request: web.Request, handler):
        body = None
        if request.can_read_body:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
        request.app[CALLS].append((request.method, request.path_qs, body))
        if api_key and request.path.startswith("/v1"):
            if request.headers.get("Authorization") != f"Bearer {api_key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    app = web.Application(middlewares=[record_and_auth])
    app[CALLS] = []
    app[STATE] = {
        "model": model,
        "paused": False,
        "resumed": asyncio.Event(),
        "loras": {},
        "weights_path": None,
        "fail_reload": False,
        "pause_delay_s": 0.0,  # vLLM's pause answers once in-flight work froze/drained: may be slow
    }
    app[STATE]["resumed"].set()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
    if dev_mode:
        app.router.add_post("/pause", pause)
        app.router.add_post("/resume", resume)
        app.router.add_get("/is_paused", is_paused)
        app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
        app.router.add_post("/collective_rpc", collective_rpc)
    return app


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    cards = [
        {"id": state["model"], "object": "model", "created": int(time.time()), "owned_by": "vllm",
         "root": state["model"], "parent": None, "max_model_len": 4096, "permission": []}
    ]
    for name, path in state["loras"].items():
        cards.append({"id": name, "object": "model", "created": int(time.time()),
                      "owned_by": "vllm", "root": path, "parent": state["model"],
                      "max_model_len": None, "permission": []})
    return web.json_response({"object": "list", "data": cards})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    try:
        body = await request.json()
    except ValueError:
        return _error("Invalid JSON", 400, "BadRequestError")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        return _error("messages: field required", 400, "BadRequestError")
    await state["resumed"].wait()  # paused: requests are held, not refused
    prompt_ids = list(range(1, 1 + sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4 + 1))
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or len(CANNED_IDS)
    n = min(max_tokens, len(CANNED_IDS))
    finish = "stop" if n == len(CANNED_IDS) else "length"
    want_ids = bool(body.get("return_token_ids"))
    want_lp = bool(body.get("logprobs"))
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.get("model", state["model"])}

    def lp_entry(i: int) -> dict[str, Any]:
        tok = CANNED_PIECES[i]
        return {"token": tok, "logprob": -0.5, "bytes": list(tok.encode()), "top_logprobs": []}

    if not body.get("stream"):
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(CANNED_PIECES[:n]),
                        "tool_calls": [], "reasoning_content": None},
            "logprobs": {"content": [lp_entry(i) for i in range(n)]} if want_lp else None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        if want_ids:
            choice["token_ids"] = CANNED_IDS[:n]
        out = {**meta, "object": "chat.completion", "choices": [choice],
               "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": n,
                         "total_tokens": len(prompt_ids) + n}}
        if want_ids:
            out["prompt_token_ids"] = prompt_ids
        return web.json_response(out)

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    base = {**meta, "object": "chat.completion.chunk"}

    async def send(obj: dict[str, Any]) -> None:
        await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

    first: dict[str, Any] = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}]}
    if want_ids:
        first["prompt_token_ids"] = prompt_ids
    await send(first)
    for i in range(n):
        await state["resumed"].wait()
        last = i == n - 1
        choice = {"index": 0, "delta": {"content": CANNED_PIECES[i]},
                  "logprobs": {"content": [lp_entry(i)]} if want_lp else None,
                  "finish_reason": finish if last else None}
        if last:
            choice["stop_reason"] = None
        if want_ids:
            choice["token_ids"] = [CANNED_IDS[i]]
        await send({**base, "choices": [choice]})
        await asyncio.sleep(0)
    if (body.get("stream_options") or {}).get("include_usage"):
        await send({**base, "choices": [], "usage": {"prompt_tokens": len(prompt_ids),
                                                     "completion_tokens": n,
                                                     "total_tokens": len(prompt_ids) + n}})
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def pause(request: web.Request) -> web.Response:
    mode = request.query.get("mode", "abort")
    if mode not in ("abort", "wait", "keep"):
        return web.json_response({"error": f"Invalid pause mode: {mode}"}, status=400)
    state = request.app[STATE]
    state["paused"] = True
    state["resumed"].clear()
    if state["pause_delay_s"]:
        await asyncio.sleep(state["pause_delay_s"])
    return web.json_response({"status": "paused"})


async def resume(request: web.Request) -> web.Response:
    state = request.app[STATE]
    state["paused"] = False
    state["resumed"].set()
    return web.json_response({"status": "resumed"})


async def is_paused(request: web.Request) -> web.Response:
    return web.json_response({"is_paused": request.app[STATE]["paused"]})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def collective_rpc(request: web.Request) -> web.Response:
    body = await request.json()
    method = body.get("method")
    if method is None:
        return web.json_response({"detail": "Missing 'method' in request body"}, status=400)
    if method != "reload_weights":
        return _error(f"Worker has no method {method!r}", 500, "InternalServerError")
    path = (body.get("kwargs") or {}).get("weights_path")
    if path is not None and not (Path(path) / "config.json").exists():
        return _error(f"reload_weights failed: no checkpoint at {path}", 500, "InternalServerError")
    request.app[STATE]["weights_path"] = path
    return web.json_response({"results": [None]})


async def load_lora_adapter(request: web.Request) -> web.Response:
    body = await request.json()
    name, path = body.get("lora_name"), body.get("lora_path")
    if not name or not path:
        return _error("Both 'lora_name' and 'lora_path' must be provided.", 400, "BadRequestError")
    loras = request.app[STATE]["loras"]
    if name in loras and not body.get("load_inplace"):
        return _error(f"The lora adapter '{name}' has already been loaded.", 400, "BadRequestError")
    if not (Path(path) / "adapter_config.json").exists():
        return _error(f"Loading lora {name} failed: No adapter found for {path}", 400, "BadRequestError")
    loras[name] = path
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")
