"""The two things the proxy needs from aiohttp that it has no public hook for, patched here only.

``install()`` applies both, once per process; ``create_app`` calls it. Each rests on a private
name, so ``tests/proxy/test_aiohttp_patches.py`` checks those names and signatures and fails when
an aiohttp upgrade moves them; replace them when aiohttp grows a hook.

- JSON for what aiohttp answers itself. A request its HTTP parser refuses (bad request line,
  header or chunk) and a handler's unexpected exception are answered by
  ``RequestHandler.handle_error`` before any route or middleware, in plain text (aiohttp issues
  #3287 and #6463: no middleware, signal or ``handler_args`` reaches them). An app that sets
  ``PROTOCOL_ERRORS`` gets that function's answer instead; every other server (the embedded engine,
  tests' fakes) keeps aiohttp's.
- Header bytes that are not UTF-8. aiohttp parses them into surrogate escapes, and its header
  writer drops surrogates: ``Bearer sk-\\xe9\\xff`` would reach the upstream as ``Bearer sk-``.
  Headers that hold such bytes are written back as the bytes they came from.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from aiohttp import http_writer, web
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict

# status, aiohttp's message, the exception -> the answer (it must close the connection)
ProtocolErrors = Callable[[int, str | None, BaseException | None], web.StreamResponse]
PROTOCOL_ERRORS: web.AppKey[ProtocolErrors] = web.AppKey("clawproxy_protocol_errors")

_ESCAPED = re.compile("[\udc80-\udcff]")


def install() -> None:
    """Apply both patches (idempotent)."""
    if not getattr(RequestHandler.handle_error, "_clawproxy", False):
        RequestHandler.handle_error = _json_handle_error(RequestHandler.handle_error)  # type: ignore[method-assign]
    if not getattr(http_writer._serialize_headers, "_clawproxy", False):
        http_writer._serialize_headers = _raw_header_writer(http_writer._serialize_headers)  # type: ignore[assignment]


def _json_handle_error(orig: Callable[..., web.StreamResponse]) -> Callable[..., web.StreamResponse]:
    @functools.wraps(orig)
    def handle_error(self: RequestHandler, request: Any, status: int = 500,
                     exc: BaseException | None = None, message: str | None = None) -> web.StreamResponse:
        resp = orig(self, request, status, exc, message)  # logs, and raises if headers went out
        app = getattr(self._request_factory, "__self__", None)  # the app whose server this is
        answer = app.get(PROTOCOL_ERRORS) if isinstance(app, web.Application) else None
        return resp if answer is None else answer(status, message, exc)

    handle_error._clawproxy = True  # type: ignore[attr-defined]
    return handle_error


def _raw_header_writer(orig: Callable[[str, CIMultiDict[str]], bytes]) -> Callable[[str, CIMultiDict[str]], bytes]:
    @functools.wraps(orig)
    def serialize(status_line: str, headers: CIMultiDict[str]) -> bytes:
        # Surrogate escapes are never ASCII: one C-speed check keeps aiohttp's path for the rest.
        if "".join(headers.values()).isascii() or not any(_ESCAPED.search(v) for v in headers.values()):
            return orig(status_line, headers)
        safe = http_writer._safe_header
        lines = [safe(status_line), *(f"{safe(k)}: {safe(v)}" for k, v in headers.items())]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")

    serialize._clawproxy = True  # type: ignore[attr-defined]
    return serialize
