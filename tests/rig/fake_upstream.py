"""A fake OpenAI-compatible model server (aiohttp) for proxy tests and the benchmark.

It speaks vLLM's extras like the real engines do: ``logprobs: true`` adds per-token log-probs,
``return_token_ids: true`` adds top-level ``prompt_token_ids`` (first chunk) and per-chunk
``choices[0].token_ids``; every chunk carries ``weight_version`` and responses the
``x-weight-version`` header. Behaviour per request comes from ``x-fake-*`` headers, so concurrent
tests do not interfere:

    x-fake-mode     text (default) | tool | tool-once | reasoning | length | degenerate | hang | hang-mid
                    (tool-once: a tool call, then text once the last message is a tool result)
    x-fake-prompt-tokens  prompt_tokens reported in ``usage`` (default 11)
    x-fake-status   answer with this HTTP status and an OpenAI error body
    x-fake-chunks   number of content chunks (default 4)
    x-fake-delay-ms pause between chunks
    x-fake-gzip     1: gzip the response body (even an event stream)
    x-fake-reject-tokens 1: answer 400 to requests with logprobs/return_token_ids (not vLLM)
    x-fake-raw      base64 of bytes streamed verbatim as the SSE body (garbage, a cut-off stream);
                    with x-fake-raw-close 1 the connection is closed after them (no chunked end)
    x-fake-stamp    1: each chunk carries ``sent_ns`` (time.monotonic_ns() when written), so a
                    client on the same machine can measure per-chunk delivery latency

Run alone: ``python -m tests.rig.fake_upstream --port 0`` prints ``PORT <n>`` when ready.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

CTX = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"


def _text(msg: dict[str, Any]) -> str:
    c = msg.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return "\n".join(p.get("text", "") for p in c if isinstance(p, dict))
    return ""


def last_user_text(messages: list[dict[str, Any]]) -> str:
    """The last real user message, skipping OpenClaw's trailing internal-context message."""
    for m in reversed(messages if isinstance(messages, list) else []):
        if isinstance(m, dict) and m.get("role") == "user" and not _text(m).lstrip().startswith(CTX):
            return _text(m)
    return ""


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeUpstream:
    """State shared by the handlers: what was received, how many streams were cut off."""

    weight_version: int | None = 7
    received: list[Received] = field(default_factory=list)
    disconnects: int = 0
    completed: int = 0
    record: bool = True
    raw_sse: bytes | None = None  # when set, streamed verbatim (e.g. a recorded OpenClaw sample)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_route("*", "/v1/echo/{tail:.*}", self.echo)
        return app

    # -- handlers ---------------------------------------------------------------------------------
    async def models(self, request: web.Request) -> web.Response:
        self._note(request, None)
        return web.json_response({"object": "list", "data": [
            {"id": "fake-model", "object": "model", "owned_by": "fake", "max_model_len": 8192}]})

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._note(request, body)
        return web.json_response({"object": "list", "data": [
            {"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}], "model": "fake"})

    async def echo(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self._note(request, raw.decode("utf-8", "replace"))
        return web.json_response({"method": request.method, "path": request.path_qs,
                                  "body": raw.decode("utf-8", "replace"),
                                  "headers": dict(request.headers)})

    def _note(self, request: web.Request, body: Any) -> None:
        if self.record:
            self.received.append(Received(request.method, request.path_qs, dict(request.headers), body))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._chat(request)
        except (AttributeError, TypeError, ValueError, KeyError) as e:
            # A real server validates the body and answers 400; so does the fake (fuzz tests).
            return web.json_response({"error": {"message": f"invalid request: {e}", "type":
                                                "BadRequestError", "param": None, "code": 400}},
                                     status=400)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self._note(request, body)
        h = request.headers
        mode = h.get("x-fake-mode", "text")
        if h.get("x-fake-status"):
            status = int(h["x-fake-status"])
            return web.json_response(
                {"error": {"message": f"fake failure {status}", "type": "server_error",
                           "param": None, "code": None}},
                status=status, headers={"Retry-After": "1"} if status == 429 else None)
        if h.get("x-fake-reject-tokens") == "1" and ("return_token_ids" in body or "logprobs" in body):
            return web.json_response({"error": {"message": "Extra inputs are not permitted: "
                                                "return_token_ids", "type": "BadRequestError",
                                                "param": None, "code": 400}}, status=400)
        if mode == "hang":
            await asyncio.sleep(3600)
        if h.get("x-fake-raw") is not None:
            return await self._raw(request, base64.b64decode(h["x-fake-raw"]),
                                   h.get("x-fake-raw-close") == "1")
        n = int(h.get("x-fake-chunks", "4"))
        delay = float(h.get("x-fake-delay-ms", "0")) / 1000
        if mode == "tool-once":
            real = [m for m in body.get("messages") or [] if not _text(m).lstrip().startswith(CTX)]
            mode = "text" if real and real[-1].get("role") == "tool" else "tool"
        prompt_tokens = int(h.get("x-fake-prompt-tokens", "11"))
        chunks = self.build_chunks(body, mode, n)
        headers = {}
        if self.weight_version is not None:
            headers["x-weight-version"] = str(self.weight_version)
        gzip = h.get("x-fake-gzip") == "1"
        if not body.get("stream"):
            obj = self.build_message(body, chunks)
            data = orjson.dumps(obj)
            if gzip:
                headers["Content-Encoding"] = "gzip"
                data = _gzip(data)
            self.completed += 1
            return web.Response(body=data, content_type="application/json", headers=headers)
        if self.raw_sse is not None:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for ev in self.raw_sse.split(b"\n\n")[:-1]:
                await resp.write(ev + b"\n\n")
            await resp.write_eof()
            return resp
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache", **headers})
        if gzip:
            resp.enable_compression(web.ContentCoding.gzip)
        await resp.prepare(request)
        stamp = h.get("x-fake-stamp") == "1"
        try:
            for i, ev in enumerate(self.events(body, chunks, prompt_tokens)):
                if stamp and ev.startswith(b"data: {"):
                    ev = b'data: {"sent_ns":%d,' % time.monotonic_ns() + ev[7:]
                await resp.write(ev)
                if mode == "hang-mid" and i == 1:
                    await asyncio.sleep(3600)
                if delay:
                    await asyncio.sleep(delay)
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnects += 1
            raise
        self.completed += 1
        return resp

    async def _raw(self, request: web.Request, data: bytes, close: bool) -> web.StreamResponse:
        if close:  # HTTP/1.0-style framing: the body ends where the connection does
            tr = request.transport
            assert tr is not None
            tr.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                     + data)
            tr.close()
            return web.Response()  # never sent: the connection is gone
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(data)
        await resp.write_eof()
        return resp

    # -- content ----------------------------------------------------------------------------------
    @staticmethod
    def build_chunks(body: dict[str, Any], mode: str, n: int) -> list[dict[str, Any]]:
        """Deltas (without envelope) the answer is made of, plus the finish reason at the end."""
        user = last_user_text(body.get("messages") or [])
        deltas: list[dict[str, Any]] = []
        if mode == "tool":
            deltas.append({"tool_calls": [{"index": 0, "id": "call_fake1", "type": "function",
                                           "function": {"name": "read", "arguments": ""}}]})
            deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": '{"path": '}}]})
            deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": '"hello.txt"}'}}]})
            return deltas + [{"finish_reason": "tool_calls"}]
        if mode == "reasoning":
            deltas.append({"reasoning_content": "Let me think. "})
            deltas.append({"reasoning_content": "Done thinking."})
        if mode == "degenerate":
            words = ["the same words again"] * max(n, 60)
            deltas += [{"content": w + " "} for w in words]
        else:
            text = f"pong: {user[:40]}" if user else "pong"
            pieces = [text] + [f" part{i}" for i in range(1, n)]
            deltas += [{"content": p} for p in pieces]
        return deltas + [{"finish_reason": "length" if mode == "length" else "stop"}]

    def _envelope(self, body: dict[str, Any], choice: dict[str, Any], first: bool) -> dict[str, Any]:
        obj: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                               "created": 1795994074, "model": body.get("model", "fake-model"),
                               "choices": [choice]}
        if self.weight_version is not None:
            obj["weight_version"] = self.weight_version
        if first and body.get("return_token_ids"):
            obj["prompt_token_ids"] = [1, 2, 3, len(body.get("messages") or [])]
        return obj

    def events(self, body: dict[str, Any], chunks: list[dict[str, Any]],
               prompt_tokens: int = 11) -> list[bytes]:
        """The SSE events for ``chunks``, token ids / log-probs only when the request asked."""
        want_lp = bool(body.get("logprobs"))
        want_ids = bool(body.get("return_token_ids"))
        out = []
        first = self._envelope(body, {"index": 0, "delta": {"role": "assistant", "content": ""},
                                      "logprobs": None, "finish_reason": None}, True)
        out.append(first)
        tok = 100
        for d in chunks:
            if "finish_reason" in d:
                choice = {"index": 0, "delta": {}, "logprobs": None,
                          "finish_reason": d["finish_reason"]}
            else:
                choice = {"index": 0, "delta": d, "logprobs": None, "finish_reason": None}
                if want_lp:
                    choice["logprobs"] = {"content": [{"token": "t", "logprob": -0.25,
                                                       "bytes": [116], "top_logprobs": []}]}
                if want_ids:
                    choice["token_ids"] = [tok]
                    tok += 1
            out.append(self._envelope(body, choice, False))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = self._envelope(body, {}, False)
            usage["choices"] = []
            usage["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": len(chunks),
                              "total_tokens": prompt_tokens + len(chunks)}
            out.append(usage)
        return [b"data: " + orjson.dumps(o) + b"\n\n" for o in out] + [b"data: [DONE]\n\n"]

    def build_message(self, body: dict[str, Any], chunks: list[dict[str, Any]]) -> dict[str, Any]:
        text = "".join(d.get("content", "") for d in chunks)
        reasoning = "".join(d.get("reasoning_content", "") for d in chunks)
        calls = [c for d in chunks for c in d.get("tool_calls", []) if c.get("id")]
        for c in calls:
            c["function"]["arguments"] = '{"path": "hello.txt"}'
            c.pop("index", None)
        finish = chunks[-1]["finish_reason"]
        msg: dict[str, Any] = {"role": "assistant", "content": text or None}
        if reasoning:
            msg["reasoning_content"] = reasoning
        if calls:
            msg["tool_calls"] = calls
        n = len(chunks) - 1
        choice: dict[str, Any] = {"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": "t", "logprob": -0.25} for _ in range(n)]}
        if body.get("return_token_ids"):
            choice["token_ids"] = list(range(100, 100 + n))
        obj: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1795994074,
                               "model": body.get("model", "fake-model"), "choices": [choice],
                               "usage": {"prompt_tokens": 11, "completion_tokens": n, "total_tokens": 11 + n}}
        if body.get("return_token_ids"):
            obj["prompt_token_ids"] = [1, 2, 3]
        if self.weight_version is not None:
            obj["weight_version"] = self.weight_version
        return obj


def _gzip(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=31)
    return c.compress(data) + c.flush()


async def _serve(port: int) -> None:
    fake = FakeUpstream(record=False)
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    try:
        while True:
            await asyncio.sleep(3600)
    finally:
        await runner.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    try:
        asyncio.run(_serve(a.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
