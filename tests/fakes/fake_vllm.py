"""A fake of ``vllm serve`` 0.33.0, route by route, for what cannot run here (vLLM needs a GPU).

Each handler names the file of the vLLM 0.33.0 wheel (``pip download --no-deps vllm==0.33.0``) it
copies; paths are under ``vllm/``. What the fake leaves out: tokenization, sampling, tool parsing.

Switches, as the real server has them:
- ``dev_mode`` = ``VLLM_SERVER_DEV_MODE=1``: ``/pause``, ``/resume``, ``/is_paused``,
  ``/reset_prefix_cache``, ``/collective_rpc``, ``/weight_info``, ``/update_weight_version``
  (``entrypoints/launchers/api_server/routers.py``).
- ``runtime_lora`` = ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``: ``/v1/load_lora_adapter`` and
  ``/v1/unload_lora_adapter`` (``entrypoints/serve/lora/api_router.py: attach_router`` returns
  without registering them otherwise).
- ``api_key`` = ``--api-key``: only paths under ``/v1`` (and ``/v2``...) are guarded
  (``entrypoints/serve/middleware/authenticate.py``).
- ``version``: what ``GET /version`` reports; ``weight_info=False`` drops ``/weight_info`` and
  ``/update_weight_version`` as servers before them do.

Failure knobs in ``app[STATE]``: ``fail_reload`` (the next ``reload_weights`` raises mid-read and,
as in ``model_executor/model_loader/reload/``, leaves the model without weights: chat answers 500
until a reload succeeds), ``fail_lora`` (the next adapter load raises in the engine: 500),
``prefix_cache_busy`` (``/reset_prefix_cache`` answers ``success: false`` unless
``reset_running_requests=true``), ``pause_delay_s`` (``pause_answered`` is set once that late answer is out). ``restart(app)``
forgets adapters and the weight version as a restarted server would.

Every call is appended to ``app[CALLS]`` as ``(method, path_qs, json_body_or_None)`` so tests can
assert the exact sequence a client sends.
"""

from __future__ import annotations

import asyncio
import json
import threading
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
PAUSED_MESSAGE = "Generation is paused. Please retry after it resumes."


def _error(message: str, status: int, type_: str, param: str | None = None) -> web.Response:
    """``ErrorResponse(error=ErrorInfo(...)).model_dump()`` with the status as ``code``
    (entrypoints/serve/engine/protocol.py, serve/exception_handling/error_response.py)."""
    return web.json_response(
        {"error": {"message": message, "type": type_, "param": param, "code": status}}, status=status
    )


def create_fake_vllm(
    model: str = "fake-model",
    api_key: str | None = None,
    dev_mode: bool = True,
    runtime_lora: bool = True,
    version: str = "0.33.0",
    weight_info: bool = True,
    max_model_len: int = 4096,
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
        # entrypoints/serve/middleware/authenticate.py: GUARDED_PREFIX, {"error": "Unauthorized"}
        if api_key and request.path.startswith(("/v1", "/v2", "/inference", "/cohere")):
            if request.headers.get("Authorization") != f"Bearer {api_key}":
                return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            return await handler(request)
        except web.HTTPNotFound:
            # Starlette's router 404 through FastAPI's default handler: no vLLM error shape
            return web.json_response({"detail": "Not Found"}, status=404)
        except web.HTTPMethodNotAllowed:
            return web.json_response({"detail": "Method Not Allowed"}, status=405)

    app = web.Application(middlewares=[record_and_auth])
    app[CALLS] = []
    app[STATE] = {
        "model": model,
        "version": version,
        "max_model_len": max_model_len,
        "pause_mode": None,  # None | keep | wait | abort
        "resumed": asyncio.Event(),
        "loras": {},  # name -> path, in load order
        "weights_path": None,
        "weights_ok": True,
        "weight_version": "default",  # v1/engine/core.py: self._weight_version = "default"
        "fail_reload": False,
        "fail_lora": False,
        "prefix_cache_busy": False,
        "pause_delay_s": 0.0,
        "pause_answered": threading.Event(),  # set when a /pause handler is done (a test thread waits on it)
        "in_flight": 0,
    }
    app[STATE]["resumed"].set()
    # entrypoints/serve/instrumentator/{health,basic}.py, openai/models/api_router.py
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/health", health)
    app.router.add_get("/version", show_version)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    if runtime_lora:
        app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
        app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)
    if dev_mode:
        app.router.add_post("/pause", pause)
        app.router.add_post("/resume", resume)
        app.router.add_get("/is_paused", is_paused)
        app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
        app.router.add_post("/collective_rpc", collective_rpc)
        if weight_info:
            app.router.add_get("/weight_info", get_weight_info)
            app.router.add_post("/update_weight_version", update_weight_version)
    return app


def restart(app: web.Application) -> None:
    """What a restarted ``vllm serve`` forgets: runtime adapters, reloads, the weight version."""
    s = app[STATE]
    s.update(loras={}, weights_path=None, weights_ok=True, weight_version="default", pause_mode=None)
    s["resumed"].set()


# -- entrypoints/serve/instrumentator/health.py, basic.py ----------------------------------------


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)  # empty body


async def show_version(request: web.Request) -> web.Response:
    return web.json_response({"version": request.app[STATE]["version"]})


# -- entrypoints/openai/models/serving.py: OpenAIServingModels -----------------------------------


def _permission() -> dict[str, Any]:
    """``ModelPermission()`` (entrypoints/serve/engine/protocol.py)."""
    return {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": int(time.time()),
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False}


def _card(id_: str, root: str, parent: str | None, max_model_len: int | None) -> dict[str, Any]:
    return {"id": id_, "object": "model", "created": int(time.time()), "owned_by": "vllm",
            "root": root, "parent": parent, "max_model_len": max_model_len, "permission": [_permission()]}


async def models(request: web.Request) -> web.Response:
    """``show_available_models``: the base card (``max_model_len``, ``root`` the model path), then
    one card per adapter (``parent`` the base name, ``root`` its path, no ``max_model_len``)."""
    s = request.app[STATE]
    cards = [_card(s["model"], s["model"], None, s["max_model_len"])]
    cards += [_card(name, path, s["model"], None) for name, path in s["loras"].items()]
    return web.json_response({"object": "list", "data": cards})


async def load_lora_adapter(request: web.Request) -> web.Response:
    """``load_lora_adapter`` + ``_check_load_lora_adapter_request``: 400 InvalidUserInput for a
    missing field, a base-model name or a second load without ``load_inplace``; 404 NotFoundError
    (``LoRAAdapterNotFoundError``) when the path holds no adapter; 500 InternalServerError when
    the engine's ``add_lora`` raises; else a plain-text 200."""
    s = request.app[STATE]
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not isinstance(path, str):
        missing = [k for k in ("lora_name", "lora_path") if not isinstance(body.get(k), str)]
        return _validation_error(missing)
    if not name or not path:
        return _error("Both 'lora_name' and 'lora_path' must be provided.", 400, "InvalidUserInput")
    if name == s["model"]:
        return _error(f"The lora adapter '{name}' conflicts with a served base model.", 400, "InvalidUserInput")
    if not body.get("load_inplace") and name in s["loras"]:
        return _error(f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                      "in place, set 'load_inplace' to True.", 400, "InvalidUserInput")
    if not (Path(path) / "adapter_config.json").exists():
        return _error(f"Loading lora {name} failed: No adapter found for {path}", 404, "NotFoundError")
    if s["fail_lora"] or not _readable_safetensors(Path(path)):
        s["fail_lora"] = False
        return _error(f"Call to add_lora method failed: adapter at {path} cannot be loaded", 500,
                      "InternalServerError")
    s["loras"][name] = path
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    s = request.app[STATE]
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    name = body.get("lora_name")
    if not name:
        return _error("'lora_name' needs to be provided to unload a LoRA adapter.", 400, "InvalidUserInput")
    if name not in s["loras"]:
        return _error(f"The lora adapter '{name}' cannot be found.", 404, "NotFoundError")
    del s["loras"][name]
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")


# -- entrypoints/openai/chat_completion/{api_router,serving,protocol}.py -------------------------


async def chat_completions(request: web.Request) -> web.StreamResponse:
    s = request.app[STATE]
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    if not isinstance(body.get("messages"), list):
        return _validation_error(["messages"])
    name = body.get("model") or s["model"]
    # serve/engine/serving.py: _check_model
    if name != s["model"] and name not in s["loras"]:
        return _error(f"The model `{name}` does not exist. Valid aliases: {s['model']}.", 404, "NotFoundError",
                      param="model")
    # v1/engine/core.py: _reject_add_while_paused (abort/wait); keep queues the request
    if s["pause_mode"] in ("abort", "wait"):
        return _paused(body)
    await s["resumed"].wait()
    if s["pause_mode"] in ("abort", "wait"):
        return _paused(body)
    if not s["weights_ok"]:
        return _error("EngineCore encountered an issue. See stack trace (above) for the root cause.",
                      500, "InternalServerError")
    s["in_flight"] += 1
    try:
        return await _generate(request, body, name)
    finally:
        s["in_flight"] -= 1


def _paused(body: dict[str, Any]) -> web.StreamResponse:
    """A rejected request surfaces as ``RetryableRequestError``: 503 ServiceUnavailableError
    (serve/exception_handling/error_response.py); a stream has sent its 200 already and carries
    the error as one event (``create_streaming_error_response``) before ``[DONE]``."""
    err = {"error": {"message": PAUSED_MESSAGE, "type": "ServiceUnavailableError", "param": None, "code": 503}}
    if body.get("stream"):
        data = b"data: " + json.dumps(err).encode() + b"\n\ndata: [DONE]\n\n"
        return web.Response(body=data, content_type="text/event-stream")
    return web.json_response(err, status=503)


async def _generate(request: web.Request, body: dict[str, Any], model: str) -> web.StreamResponse:
    s = request.app[STATE]
    prompt_ids = list(range(1, 1 + sum(len(str(m.get("content", ""))) for m in body["messages"]) // 4 + 1))
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or len(CANNED_IDS)
    n = min(max_tokens, len(CANNED_IDS))
    finish = "stop" if n == len(CANNED_IDS) else "length"
    want_ids = bool(body.get("return_token_ids"))
    want_lp = bool(body.get("logprobs"))
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}
    usage = {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + n, "completion_tokens": n,
             "prompt_tokens_details": None}

    def lp_entry(i: int) -> dict[str, Any]:
        tok = CANNED_PIECES[i]
        return {"token": tok, "logprob": -0.5, "bytes": list(tok.encode()), "top_logprobs": []}

    if not body.get("stream"):
        # ChatCompletionResponse.model_dump(): every field, None included; ChatMessage drops an
        # empty tool_calls and names the reasoning text ``reasoning``
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(CANNED_PIECES[:n]), "refusal": None,
                        "annotations": None, "audio": None, "function_call": None, "reasoning": None},
            "logprobs": {"content": [lp_entry(i) for i in range(n)]} if want_lp else None,
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": CANNED_IDS[:n] if want_ids else None,
            "routed_experts": None,
            "weight_versions": None,
        }
        out = {**meta, "object": "chat.completion", "choices": [choice], "service_tier": None,
               "system_fingerprint": None, "usage": usage, "prompt_logprobs": None,
               "prompt_token_ids": prompt_ids if want_ids else None, "prompt_text": None,
               "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}
        return web.json_response(out)

    # chat_completion_stream_generator: model_dump_json(exclude_unset=True, exclude_none=not
    # chunk.choices): fields the server sets explicitly stay, as null when not asked for
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    base = {**meta, "object": "chat.completion.chunk"}

    async def send(obj: dict[str, Any]) -> None:
        await resp.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

    await send({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                     "logprobs": None, "finish_reason": None}],
                "prompt_token_ids": prompt_ids if want_ids else None, "prompt_text": None})
    for i in range(n):
        await s["resumed"].wait()  # keep: frozen where it stands, continues on /resume
        last = i == n - 1
        choice = {"index": 0, "delta": {"content": CANNED_PIECES[i]},
                  "logprobs": {"content": [lp_entry(i)]} if want_lp else None,
                  "finish_reason": finish if last else None,
                  "token_ids": [CANNED_IDS[i]] if want_ids else None}
        chunk: dict[str, Any] = {**base, "choices": [choice]}
        if last:
            choice.update(stop_reason=None, weight_versions=None)
            chunk["kv_transfer_params"] = None
        await send(chunk)
        await asyncio.sleep(0)
    if (body.get("stream_options") or {}).get("include_usage"):
        await send({**base, "choices": [], "usage": {k: v for k, v in usage.items() if v is not None}})
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


# -- entrypoints/rl/online/api_router.py (dev mode) ----------------------------------------------


async def pause(request: web.Request) -> web.Response:
    """``pause_generation``: ``{"status": "paused"}``; an unknown mode is a FastAPI query
    validation error (``PauseMode`` is a Literal): 400 in vLLM's error shape."""
    mode = request.query.get("mode", "abort")
    if mode not in ("abort", "wait", "keep"):
        return _error("1 validation error:\n  Input should be 'abort', 'wait' or 'keep'", 400, "Bad Request",
                      param="query.mode")
    s = request.app[STATE]
    s["pause_mode"] = mode
    s["resumed"].clear()
    try:
        if s["pause_delay_s"]:
            await asyncio.sleep(s["pause_delay_s"])
        return web.json_response({"status": "paused"})
    finally:
        s["pause_answered"].set()


async def resume(request: web.Request) -> web.Response:
    s = request.app[STATE]
    s["pause_mode"] = None
    s["resumed"].set()
    return web.json_response({"status": "resumed"})


async def is_paused(request: web.Request) -> web.Response:
    return web.json_response({"is_paused": request.app[STATE]["pause_mode"] is not None})


async def get_weight_info(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": request.app[STATE]["weight_version"]})


async def update_weight_version(request: web.Request) -> web.Response:
    """``Body(embed=True)``: ``{"new_version": "<str>"}``."""
    body = await _json_body(request)
    if isinstance(body, web.Response):
        return body
    if not isinstance(body.get("new_version"), str):
        return _validation_error(["new_version"])
    request.app[STATE]["weight_version"] = body["new_version"]
    return web.json_response({"success": True, "new_version": body["new_version"]})


# -- entrypoints/serve/dev/cache/api_router.py, serve/dev/rpc/api_router.py (dev mode) -----------


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """``{"success": bool}``; false while running requests hold blocks (v1/core/sched/scheduler.py:
    reset_prefix_cache) unless ``reset_running_requests=true`` preempts them."""
    s = request.app[STATE]
    force = request.query.get("reset_running_requests", "false").lower() in ("true", "1")
    busy = s["prefix_cache_busy"] or (s["in_flight"] > 0 and s["pause_mode"] == "keep")
    return web.json_response({"success": force or not busy})


async def collective_rpc(request: web.Request) -> web.Response:
    """``{"method", "args", "kwargs", "timeout"}``; a missing method is an HTTPException(400)
    (``{"error": {..., "type": "Bad Request"}}``); a worker exception reaches the raw Exception
    handler: 500 InternalServerError. ``reload_weights`` returns None per worker."""
    s = request.app[STATE]
    try:
        body = await request.json()
    except ValueError as e:
        return _error(f"JSON decode error: {e}", 400, "Bad Request")
    if not isinstance(body, dict):
        return _error("Request body must be a JSON object", 400, "Bad Request")
    method = body.get("method")
    if method is None:
        return _error("Missing 'method' in request body", 400, "Bad Request")
    if method != "reload_weights":
        return _error(f"Method {method} is not implemented", 500, "InternalServerError")
    path = (body.get("kwargs") or {}).get("weights_path")
    # model_executor/model_loader/reload/inplace.py: layers go to meta first; a read that fails
    # leaves them there (no restore), so the engine has no usable weights until the next reload
    if s["fail_reload"] or (path is not None and not (
            (Path(path) / "config.json").exists() and _readable_safetensors(Path(path)))):
        s["fail_reload"] = False
        s["weights_ok"] = False
        s["weights_path"] = path
        return _error(f"Error in model execution: cannot read weights from {path}", 500, "InternalServerError")
    s["weights_ok"] = True
    s["weights_path"] = path
    return web.json_response({"results": [None]})


# -- helpers -------------------------------------------------------------------------------------


async def openapi(request: web.Request) -> web.Response:
    """FastAPI's schema: the paths this server registered (what EngineClient.check_vllm reads)."""
    paths = sorted({r.resource.canonical for r in request.app.router.routes() if r.resource is not None})
    return web.json_response({"openapi": "3.1.0", "paths": {p: {} for p in paths}})


def _readable_safetensors(path: Path) -> bool:
    """What loading needs of a directory: at least one ``.safetensors`` file with a JSON header."""
    files = list(path.glob("*.safetensors"))
    try:
        for f in files:
            with open(f, "rb") as fh:
                json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
    except (OSError, ValueError):
        return False
    return bool(files)


async def _json_body(request: web.Request) -> dict[str, Any] | web.Response:
    """``validate_json_request`` + pydantic parsing (entrypoints/serve/utils/api_utils.py)."""
    try:
        body = await request.json()
    except ValueError:
        return _error("1 validation error:\n  JSON decode error", 400, "Bad Request", param="body")
    if not isinstance(body, dict):
        return _error("1 validation error:\n  Input should be a valid dictionary", 400, "Bad Request",
                      param="body")
    return body


def _validation_error(fields: list[str]) -> web.Response:
    """``validation_exception_handler``: 400 ``Bad Request`` listing the missing fields."""
    label = "error" if len(fields) == 1 else "errors"
    lines = "\n".join(f"  body.{f}: Field required" for f in fields)
    return _error(f"{len(fields)} validation {label}:\n{lines}", 400, "Bad Request", param=f"body.{fields[0]}")
