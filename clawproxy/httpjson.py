"""JSON over HTTP for our synchronous clients: EngineClient, the supervisor's readiness probe, the
simulator, the LLM judge and persona, the benchmarks. Standard library only (no torch, no aiohttp).

Every request goes straight to its server: urlopen would send even 127.0.0.1 through
``$http_proxy`` unless ``$no_proxy`` lists it (aiohttp ignores those variables, so the proxy does).
A failure raises one ``ClawproxyError`` subclass, the caller's choice, with the HTTP status
(503 for a server that could not be reached) and the server's own message.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPResponse
from typing import Any

from clawproxy.errors import ClawproxyError, UpstreamError

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def strip_v1(url: str) -> str:
    """An OpenAI-compatible base URL without a trailing slash or ``/v1``: routes add their own."""
    return url.rstrip("/").removesuffix("/v1")


def open_url(method: str, url: str, body: Any = None, *, token: str | None = None, timeout: float = 30.0,
             query: dict[str, str] | None = None, error: type[ClawproxyError] = UpstreamError,
             headers: dict[str, str] | None = None) -> HTTPResponse:
    """Send one request with a JSON ``body`` (None: no body) and any extra ``headers``; the open
    response, to read or stream (use it as a context manager). Raises ``error`` as ``request_json`` does."""
    if query:
        url += "?" + urllib.parse.urlencode(query)
    data = json.dumps(body).encode() if body is not None else None
    sent = {"Accept": "application/json", **(headers or {})}
    if data is not None:
        sent["Content-Type"] = "application/json"
    if token:
        sent["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, headers=sent, method=method)
    path = urllib.parse.urlsplit(url).path
    try:
        return _OPENER.open(req, timeout=timeout)
    except urllib.error.HTTPError as err:
        raw = err.read()
        raise error(f"{method} {path} refused ({err.code}): {error_message(raw) or err.reason}",
                    status=err.code) from None
    except (urllib.error.URLError, OSError) as err:
        where = urllib.parse.urlsplit(url)
        reason = getattr(err, "reason", err)
        raise error(f"{method} {path}: {where.scheme}://{where.netloc} unreachable: {reason}",
                    status=503) from None


def request_json(method: str, url: str, body: Any = None, *, token: str | None = None,
                 timeout: float = 30.0, query: dict[str, str] | None = None,
                 error: type[ClawproxyError] = UpstreamError, headers: dict[str, str] | None = None) -> Any:
    """Send one request; the decoded JSON answer (None when empty, the text when not JSON).

    An error status raises ``error(status=<that status>)`` with the server's message; a server
    that cannot be reached (refused, timed out) raises ``error(status=503)``.
    """
    with open_url(method, url, body, token=token, timeout=timeout, query=query, error=error,
                  headers=headers) as resp:
        try:
            raw = resp.read()
        except OSError as err:  # a read timeout or a reset after the headers
            path = urllib.parse.urlsplit(url).path
            raise error(f"{method} {path}: the answer was cut off: {err}", status=503) from None
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def answers_ok(url: str, timeout: float = 2.0, token: str | None = None) -> bool:
    """True when GET ``url`` answers 200 (never raises): a server is up and ready."""
    try:
        with open_url("GET", url, timeout=timeout, token=token) as resp:
            return resp.status == 200
    except ClawproxyError:
        return False


def error_message(raw: bytes) -> str:
    """The human message in any error shape the servers we talk to use.

    OpenAI/vLLM ``{"error": {"message": ...}}``, vLLM dev routes ``{"error": "..."}``, FastAPI
    ``{"detail": ...}``, older vLLM ``{"object": "error", "message": ...}``.
    """
    text = raw.decode(errors="replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("detail") is not None:
            return str(body["detail"])
        if body.get("message"):
            return str(body["message"])
    return text[:500]
