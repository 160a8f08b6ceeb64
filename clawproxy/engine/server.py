"""The embedded engine's HTTP server: OpenAI chat completions with vLLM's extras, plus vLLM's
dev-mode control verbs, on aiohttp.

Wire shapes follow vLLM's OpenAI server (``vllm/entrypoints/openai/chat_completion``):
- streamed chunks: a first chunk with ``delta: {"role": "assistant", "content": ""}``, then one
  chunk per decode step, the last with ``finish_reason``; with
  ``stream_options.include_usage`` a final ``choices: []`` chunk carrying ``usage``; then
  ``data: [DONE]`` (docs/openclaw-wire.md §3.2 is what OpenClaw needs of it);
- ``return_token_ids: true`` (vLLM >= 0.10.2): top-level ``prompt_token_ids`` (in the first chunk
  when streaming) and ``choices[i].token_ids`` (the step's completion ids per chunk when
  streaming, all of them otherwise);
- ``logprobs`` / ``top_logprobs``: ``choices[i].logprobs.content[*]`` with ``token``, ``logprob``,
  ``bytes``, ``top_logprobs``; -inf is clamped to -9999.0 as vLLM does;
- ``stop_reason`` next to ``finish_reason`` (the stop string or EOS id that ended generation);
- ``usage.prompt_tokens_details.cached_tokens``: the prompt tokens the prefix cache held (vLLM
  sends it with ``--enable-prompt-tokens-details``; OpenClaw reads it as its cache-read count);
- errors: ``{"error": {"message", "type": "BadRequestError", "param", "code": 400}}``.

Ours on top: a top-level integer ``weight_version`` on every response and chunk (the weights
that produced that chunk's tokens; for a non-streamed response, those of its last token) and an
``x-weight-version`` header (the version serving when the response started).

Control routes (vLLM dev mode, ``vllm/entrypoints/serve/dev/rlhf/api_router.py``):
``POST /pause?mode=keep|wait|abort``, ``POST /resume``, ``GET /is_paused``,
``POST /reset_prefix_cache`` (drops the engine's prefix cache; a reload also does),
``POST /collective_rpc`` (only ``method: "reload_weights"`` with ``kwargs.weights_path``, the
call vLLM users make to reload from disk), ``POST /v1/load_lora_adapter``
(``{"lora_name", "lora_path"}`` as vLLM's LoRA route, plus our ``weight_version``), and ours:
``POST /reload_weights {"weights_path", "weight_version"}`` and
``GET /weight_info`` -> ``{"weight_version": N}`` (the route newer vLLM uses for its version
string; ours is an integer). Control routes are open to loopback clients only, unless a control
token is set, in which case ``Authorization: Bearer <token>`` is required from everyone (the guard
the proxy uses too, ``clawproxy/edge.py``).

LoRA adapters: the embedded engine merges the adapter into the weights every request gets. An
engine that serves them by name (``Serving.adapters_by_name``: llama.cpp) does what vLLM does:
``/v1/models`` lists each adapter (``root`` its directory, ``parent`` the base's name), a request's
``model`` picks one (``The model `X` does not exist.``, 404, for a name it does not serve), its
chunks carry that adapter's weight version, ``load_inplace`` replaces an adapter of the same name,
and ``POST /v1/unload_lora_adapter {"lora_name"}`` drops one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from aiohttp import web

from clawproxy.chat_template import render_chat
from clawproxy.edge import control_route, error_response
from clawproxy.engine.generation import (
    GenRequest,
    SamplingParams,
    ServesAdapters,
    Serving,
    StepEvent,
)
from clawproxy.engine.toolcalls import tool_names
from clawproxy.engine.tools import ToolCallStreamParser
from clawproxy.engine_spec import engine_spec
from clawproxy.errors import ClawproxyError, NotFound, RequestError, error_body

log = logging.getLogger(__name__)


@dataclass
class ServerSettings:
    """What the HTTP layer needs besides the engine."""

    served_model_name: str
    model_root: str
    max_model_len: int
    default_max_tokens: int | None = None  # None: fill the context, as vLLM does
    control_token: str | None = None
    # defaults for what a request leaves out, from the model's generation_config.json (vLLM's
    # --generation-config auto): temperature, top_p, repetition_penalty
    sampling_defaults: dict[str, float] = field(default_factory=dict)


ENGINE = web.AppKey("engine", Serving)
SETTINGS = web.AppKey("settings", ServerSettings)


def _error(err: ClawproxyError) -> web.Response:
    return error_response(err, vllm=True)


def _named(engine: Serving) -> ServesAdapters | None:
    """The engine, where it serves LoRA adapters by name; None where it merges its one adapter."""
    return cast(ServesAdapters, engine) if engine.adapters_by_name else None


def _serving_version(engine: Serving, adapter: str | None) -> int:
    named = _named(engine)
    return engine.weight_version if named is None else named.serving_version(adapter)


def create_app(engine: Serving, settings: ServerSettings) -> web.Application:
    """Build the aiohttp app; the engine's worker thread starts and stops with it."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[ENGINE] = engine
    app[SETTINGS] = settings

    async def engine_ctx(app: web.Application):
        engine.start()
        yield
        await asyncio.to_thread(engine.stop)

    async def end_generation(app: web.Application) -> None:
        # Shutdown: end in-flight generations now (finish_reason "abort", then [DONE]) so their
        # handlers return instead of holding the process until aiohttp's shutdown timeout.
        await asyncio.to_thread(engine.stop)

    app.cleanup_ctx.append(engine_ctx)
    app.on_shutdown.append(end_generation)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    for method, path, handler in (
        ("POST", "/pause", pause),
        ("POST", "/resume", resume),
        ("GET", "/is_paused", is_paused),
        ("POST", "/reset_prefix_cache", reset_prefix_cache),
        ("POST", "/reload_weights", reload_weights),
        ("POST", "/collective_rpc", collective_rpc),
        ("POST", "/v1/load_lora_adapter", load_lora_adapter),
        ("POST", "/v1/unload_lora_adapter", unload_lora_adapter),
        ("GET", "/weight_info", weight_info),
        ("GET", "/get_weight_version", weight_info),
    ):
        app.router.add_route(method, path, control_route(
            handler, lambda r: r.app[SETTINGS].control_token, "--control-token", vllm=True))
    return app


# -- public routes --------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    return web.json_response(
        {"status": "ok", "weight_version": engine.weight_version, "paused": engine.is_paused,
         **engine.load()},
        headers={"x-weight-version": str(engine.weight_version)},
    )


async def models(request: web.Request) -> web.Response:
    """The base model's card, then (as vLLM's ``show_available_models``) one per adapter served by name."""
    s = request.app[SETTINGS]
    named = _named(request.app[ENGINE])

    def card(id_: str, root: str, parent: str | None, max_model_len: int | None) -> dict[str, Any]:
        return {"id": id_, "object": "model", "created": int(time.time()), "owned_by": "clawproxy",
                "root": root, "parent": parent, "max_model_len": max_model_len, "permission": []}

    cards = [card(s.served_model_name, s.model_root, None, s.max_model_len)]
    if named is not None:
        cards += [card(name, a.path, s.served_model_name, None) for name, a in named.adapters().items()]
    return web.json_response({"object": "list", "data": cards})


@dataclass
class ChatJob:
    """One validated chat request, rendered to token ids."""

    prompt_ids: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    return_token_ids: bool
    parse_tools: bool
    tool_names: set[str] | None = None  # what the request offered: other names stay text, as in vLLM
    adapter: str | None = None  # the LoRA adapter its model names (an engine serving them by name)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    engine, settings = request.app[ENGINE], request.app[SETTINGS]
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError) as err:
        return _error(RequestError(f"request body is not valid JSON: {err}"))
    try:
        job = await asyncio.to_thread(_prepare, engine, settings, body)
    except RequestError as err:
        return _error(err)

    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[StepEvent] = asyncio.Queue()
    req = GenRequest(
        prompt_ids=job.prompt_ids,
        params=job.params,
        emit=lambda ev: loop.call_soon_threadsafe(queue.put_nowait, ev),
        adapter=job.adapter,
    )
    meta = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": job.adapter or settings.served_model_name,
    }
    engine.submit(req)
    try:
        if job.stream:
            return await _stream(request, engine, job, queue, meta)
        return await _complete(request, engine, job, queue, meta)
    finally:
        if not req.finished:
            engine.cancel(req)


def _prepare(engine: Serving, settings: ServerSettings, body: Any) -> ChatJob:
    """Validate the request (OpenAI + vLLM extras) and render the prompt with the chat template."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    adapter = _adapter(engine, settings, body.get("model"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise RequestError(f"messages[{i}] needs a role of system, user, assistant or tool", param="messages")
    n = body.get("n", 1)
    if n not in (1, None):
        raise RequestError("only n=1 is supported", param="n")
    dflt = settings.sampling_defaults
    temperature = _number(body, "temperature", dflt.get("temperature", 1.0), 0.0, 2.0)
    top_p = _number(body, "top_p", dflt.get("top_p", 1.0), 0.0, 1.0)
    repetition_penalty = _number(body, "repetition_penalty", dflt.get("repetition_penalty", 1.0),
                                 0.01, 2.0)
    frequency_penalty = _number(body, "frequency_penalty", 0.0, -2.0, 2.0)
    presence_penalty = _number(body, "presence_penalty", 0.0, -2.0, 2.0)
    if top_p <= 0.0:
        raise RequestError("top_p must be in (0, 1]", param="top_p")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise RequestError("max_tokens must be a positive integer", param="max_tokens")
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError("'stop' must be a string or a list of non-empty strings", param="stop")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise RequestError("seed must be an integer", param="seed")
    logprobs = body.get("logprobs") or False
    if not isinstance(logprobs, bool):
        raise RequestError("logprobs must be a boolean", param="logprobs")
    top_logprobs = body.get("top_logprobs") or 0
    if not isinstance(top_logprobs, int) or not 0 <= top_logprobs <= 20:
        raise RequestError("top_logprobs must be an integer between 0 and 20", param="top_logprobs")
    if top_logprobs and not logprobs:
        raise RequestError("top_logprobs requires logprobs=true", param="top_logprobs")
    tools = body.get("tools") or None
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise RequestError("'tools' must be a list of tool objects", param="tools")
    tool_choice = body.get("tool_choice", "auto")
    if tool_choice == "none":
        tools = None
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise RequestError("stream_options must be an object", param="stream_options")
    template_kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(template_kwargs, dict):
        raise RequestError("chat_template_kwargs must be an object", param="chat_template_kwargs")

    tokenizer = engine.tokenizer
    try:
        text = render_chat(
            tokenizer,
            messages,
            tools,
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            tools_as_text=engine_spec("embedded").tools_as_text,
            **template_kwargs,
        )
    except Exception as err:  # jinja errors, templates that reject a role order...
        raise RequestError(f"the chat template could not render these messages: {err}", param="messages") from None
    with engine.tokenizer_lock:
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    room = settings.max_model_len - len(prompt_ids)
    if room < 1 or (max_tokens is not None and max_tokens > room):
        asked = max_tokens or 1
        raise RequestError(
            f"This model's maximum context length is {settings.max_model_len} tokens. However, you "
            f"requested {len(prompt_ids) + asked} tokens ({len(prompt_ids)} in the messages, "
            f"{asked} in the completion). Please reduce the length of the messages or completion.",
            param="messages",
        )
    if max_tokens is None:
        max_tokens = room if settings.default_max_tokens is None else min(room, settings.default_max_tokens)
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        stop=stop,
        seed=seed,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        ignore_eos=bool(body.get("ignore_eos", False)),
        repetition_penalty=repetition_penalty,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
    )
    return ChatJob(
        prompt_ids=list(prompt_ids),
        params=params,
        stream=bool(body.get("stream", False)),
        include_usage=bool(stream_options.get("include_usage", False)),
        return_token_ids=bool(body.get("return_token_ids", False)),
        parse_tools=bool(tools),
        tool_names=tool_names(tools),
        adapter=adapter,
    )


def _adapter(engine: Serving, settings: ServerSettings, model: Any) -> str | None:
    """The adapter a request's ``model`` names (None: the base model), where the engine serves them by
    name; vLLM's 404 for a name it does not serve (``_check_model``), which the proxy answers by loading
    the adapter again (``proxy/routing.py``). The embedded engine serves any name."""
    named = _named(engine)
    if named is None or model is None or model == settings.served_model_name:
        return None
    if isinstance(model, str) and model in named.adapters():
        return model
    raise NotFound(f"The model `{model}` does not exist.", param="model")


def _number(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool) or not lo <= value <= hi:
        raise RequestError(f"{key} must be a number between {lo} and {hi}", param=key)
    return float(value)


class _TokenText:
    """Token id -> its text, cached (logprob entries name each token)."""

    def __init__(self, engine: Serving) -> None:
        self.engine = engine
        self.cache: dict[int, str] = {}

    def __call__(self, tok: int) -> str:
        text = self.cache.get(tok)
        if text is None:
            with self.engine.tokenizer_lock:
                text = self.cache[tok] = self.engine.tokenizer.decode([tok])
        return text


def _logprob_entries(ev: StepEvent, token_text: _TokenText) -> list[dict[str, Any]]:
    entries = []
    for i, tok in enumerate(ev.token_ids):
        text = token_text(tok)
        top = ev.top_logprobs[i] if i < len(ev.top_logprobs) else []
        entries.append(
            {
                "token": text,
                "logprob": max(ev.logprobs[i], -9999.0),
                "bytes": list(text.encode()),
                "top_logprobs": [
                    {
                        "token": token_text(t),
                        "logprob": max(lp, -9999.0),
                        "bytes": list(token_text(t).encode()),
                    }
                    for t, lp in top
                ],
            }
        )
    return entries


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


GONE_POLL_S = 0.5


async def _events(queue: asyncio.Queue[StepEvent], request: web.Request) -> AsyncIterator[StepEvent]:
    """The request's step events, up to and including the one that finishes or fails it.

    ConnectionResetError once the client has gone: aiohttp does not cancel a handler whose client
    left, and a long prompt's prefill (a minute on llama.cpp on a laptop CPU) writes nothing that
    would fail, so the connection is looked at between events; the caller's ``finally`` cancels
    the request, which frees the engine (the proxy's warm-up relies on it: proxy/warmup.py)."""
    getter: asyncio.Task[StepEvent] | None = None
    try:
        while True:
            if request.transport is None or request.transport.is_closing():
                raise ConnectionResetError("the client went away")
            if getter is None and not queue.empty():
                ev = queue.get_nowait()
            else:
                getter = getter or asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({getter}, timeout=GONE_POLL_S)
                if not done:
                    continue
                ev, getter = getter.result(), None
            yield ev
            if ev.error or ev.finish_reason is not None:
                return
    finally:
        if getter is not None:
            getter.cancel()


def _finish_reason(reason: str | None, parser: ToolCallStreamParser) -> str | None:
    """vLLM reports a stop that ended in a parsed tool call as "tool_calls"."""
    return "tool_calls" if reason == "stop" and parser.calls else reason


async def _stream(
    request: web.Request,
    engine: Serving,
    job: ChatJob,
    queue: asyncio.Queue[StepEvent],
    meta: dict[str, Any],
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "x-weight-version": str(_serving_version(engine, job.adapter)),
        }
    )
    await resp.prepare(request)
    token_text = _TokenText(engine)
    parser = ToolCallStreamParser(enabled=job.parse_tools, tools=job.tool_names)
    base = {**meta, "object": "chat.completion.chunk"}

    def chunk(delta: dict, version: int, finish: str | None = None, stop_reason: Any = None,
              ev: StepEvent | None = None, **extra: Any) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = stop_reason
        if ev is not None and job.params.logprobs and ev.token_ids:
            choice["logprobs"] = {"content": _logprob_entries(ev, token_text)}
        if ev is not None and job.return_token_ids:
            choice["token_ids"] = list(ev.token_ids)
        return _sse({**base, "choices": [choice], **extra, "weight_version": version})

    try:
        first_extra: dict[str, Any] = {"prompt_token_ids": job.prompt_ids} if job.return_token_ids else {}
        version = _serving_version(engine, job.adapter)
        await resp.write(chunk({"role": "assistant", "content": ""}, version, **first_extra))
        n_completion, cached = 0, 0
        async for ev in _events(queue, request):
            version, cached = ev.weight_version, ev.cached_tokens or cached
            n_completion += len(ev.token_ids)
            if ev.error:
                await resp.write(_sse(error_body(ClawproxyError(ev.error), vllm=True)))
                break
            parsed = parser.feed(ev.text)
            if ev.finish_reason is not None:
                tail = parser.finish()
                parsed.content += tail.content
                parsed.tool_calls += tail.tool_calls
            deltas: list[dict[str, Any]] = []
            if parsed.content:
                deltas.append({"content": parsed.content})
            deltas += [{"tool_calls": [tc]} for tc in parsed.tool_calls]
            finish = _finish_reason(ev.finish_reason, parser)
            if not deltas and (ev.token_ids and (job.return_token_ids or job.params.logprobs) or finish):
                deltas.append({})
            for i, delta in enumerate(deltas):
                last = i == len(deltas) - 1
                await resp.write(chunk(delta, version, finish=finish if last else None,
                                       stop_reason=ev.stop_reason, ev=ev if i == 0 else None))
        if job.include_usage:
            usage = _usage(len(job.prompt_ids), n_completion, cached)
            await resp.write(_sse({**base, "choices": [], "usage": usage, "weight_version": version}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionResetError:
        # The client went away mid-stream; the caller's finally frees its batch slot.
        log.info("client disconnected from %s", meta["id"])
    return resp


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    """OpenAI usage, with vLLM's prompt_tokens_details.cached_tokens (serving.py
    _make_prompt_tokens_details, there behind --enable-prompt-tokens-details; always on here)."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def _complete(
    request: web.Request, engine: Serving, job: ChatJob, queue: asyncio.Queue[StepEvent], meta: dict[str, Any]
) -> web.Response:
    try:
        events = [ev async for ev in _events(queue, request)]
    except ConnectionResetError:  # nobody to answer; the caller cancels the request
        log.info("client disconnected from %s", meta["id"])
        return web.Response(status=499)
    if events[-1].error:
        return _error(ClawproxyError(events[-1].error))
    token_ids = [t for ev in events for t in ev.token_ids]
    text = "".join(ev.text for ev in events)
    parser = ToolCallStreamParser(enabled=job.parse_tools, tools=job.tool_names)
    first, tail = parser.feed(text), parser.finish()
    content = first.content + tail.content
    final = events[-1]
    finish = _finish_reason(final.finish_reason, parser)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if (content or not parser.calls) else None,
        "tool_calls": parser.calls,
        "reasoning_content": None,
    }
    logprobs = None
    if job.params.logprobs:
        token_text = _TokenText(engine)
        logprobs = {"content": [e for ev in events for e in _logprob_entries(ev, token_text)]}
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish,
        "stop_reason": final.stop_reason,
    }
    if job.return_token_ids:
        choice["token_ids"] = token_ids
    body: dict[str, Any] = {
        **meta,
        "object": "chat.completion",
        "choices": [choice],
        "usage": _usage(len(job.prompt_ids), len(token_ids), max(ev.cached_tokens for ev in events)),
        "weight_version": final.weight_version,
    }
    if job.return_token_ids:
        body["prompt_token_ids"] = job.prompt_ids
    return web.json_response(body, headers={"x-weight-version": str(final.weight_version)})


# -- control routes -------------------------------------------------------------------------


async def _json_body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError as err:
        raise RequestError(f"request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    return body


async def pause(request: web.Request) -> web.Response:
    mode = request.query.get("mode", "abort")  # vLLM's default mode is abort
    if mode not in ("keep", "wait", "abort"):
        raise RequestError(f"mode={mode!r}: use keep, wait or abort", param="mode")
    await asyncio.to_thread(request.app[ENGINE].pause, mode)
    return web.json_response({"status": "paused", "mode": mode})


async def resume(request: web.Request) -> web.Response:
    request.app[ENGINE].resume()
    return web.json_response({"status": "resumed"})


async def is_paused(request: web.Request) -> web.Response:
    return web.json_response({"is_paused": request.app[ENGINE].is_paused})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    await asyncio.to_thread(request.app[ENGINE].reset_prefix_cache)
    return web.json_response({"status": "ok"})


async def weight_info(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": request.app[ENGINE].weight_version})


def _version_arg(body: dict[str, Any]) -> int | None:
    version = body.get("weight_version", body.get("version"))
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise RequestError("weight_version must be an integer", param="weight_version")
    return version


async def reload_weights(request: web.Request) -> web.Response:
    body = await _json_body(request)
    path = body.get("weights_path", body.get("path"))
    if not isinstance(path, str) or not path:
        raise RequestError("'weights_path' (a checkpoint directory) is required", param="weights_path")
    version = await asyncio.to_thread(request.app[ENGINE].reload_full, Path(path), _version_arg(body))
    return web.json_response({"status": "ok", "weight_version": version})


async def collective_rpc(request: web.Request) -> web.Response:
    body = await _json_body(request)
    if body.get("method") != "reload_weights":
        raise RequestError("this engine supports collective_rpc method 'reload_weights' only", param="method")
    kwargs = body.get("kwargs") or {}
    path = kwargs.get("weights_path")
    if not isinstance(path, str) or not path:
        raise RequestError("kwargs.weights_path (a checkpoint directory) is required", param="kwargs")
    version = await asyncio.to_thread(request.app[ENGINE].reload_full, Path(path), _version_arg(kwargs))
    return web.json_response({"results": [None], "weight_version": version})


async def load_lora_adapter(request: web.Request) -> web.Response:
    body = await _json_body(request)
    path = body.get("lora_path")
    if not isinstance(path, str) or not path:
        raise RequestError("'lora_path' (a PEFT adapter directory) is required", param="lora_path")
    engine, name = request.app[ENGINE], body.get("lora_name")
    named = _named(engine)
    if named is None:
        version = await asyncio.to_thread(engine.load_lora, Path(path), _version_arg(body))
        name = name or "adapter"
    else:
        # vLLM's checks (_check_load_lora_adapter_request)
        if not isinstance(name, str) or not name:
            raise RequestError("Both 'lora_name' and 'lora_path' must be provided.", param="lora_name")
        if name == request.app[SETTINGS].served_model_name:
            raise RequestError(f"The lora adapter '{name}' conflicts with a served base model.", param="lora_name")
        if not body.get("load_inplace") and name in named.adapters():
            raise RequestError(f"The lora adapter '{name}' has already been loaded. If you want to load the "
                               "adapter in place, set 'load_inplace' to True.", param="lora_name")
        version = await asyncio.to_thread(named.load_lora, Path(path), _version_arg(body), name)
    return web.json_response(
        {"status": "ok", "weight_version": version,
         "message": f"Success: LoRA adapter '{name}' added successfully."}
    )


async def unload_lora_adapter(request: web.Request) -> web.Response:
    named = _named(request.app[ENGINE])
    if named is None:
        raise NotFound("this engine merges its adapter into the weights: load another, or reload the base")
    name = (await _json_body(request)).get("lora_name")
    if not isinstance(name, str) or not name:
        raise RequestError("'lora_name' needs to be provided to unload a LoRA adapter.", param="lora_name")
    await asyncio.to_thread(named.unload_lora, name)
    return web.json_response({"status": "ok", "message": f"Success: LoRA adapter '{name}' removed successfully."})
