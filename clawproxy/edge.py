"""The HTTP edge the proxy and the embedded engine share: one way to answer an error, one guard
for control routes.

Both servers raise ``ClawproxyError`` (clawproxy/errors.py) and answer it with ``error_response``;
both put their control routes behind ``control_route``: open to loopback clients when no token is
set, otherwise to whoever sends ``Authorization: Bearer <token>`` (compared in constant time).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from clawproxy.errors import ClawproxyError, Forbidden, Unauthorized, error_body

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(err: ClawproxyError, *, vllm: bool = False) -> web.Response:
    """``err`` as a JSON error with its HTTP status (``vllm``: in vLLM's dialect, see ``error_body``)."""
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else {}
    if err.status == 401:
        headers["WWW-Authenticate"] = "Bearer"  # RFC 9110: a 401 names the scheme that would work
    return web.Response(status=err.status, body=orjson.dumps(error_body(err, vllm=vllm)),
                        content_type="application/json", headers=headers)


def has_bearer(request: web.Request, token: str) -> bool:
    """Whether the request carries ``Authorization: Bearer <token>``.

    Compared as bytes: aiohttp keeps header bytes that are not UTF-8 as surrogate escapes, which a
    plain ``str.encode()`` (or ``compare_digest`` on str) refuses with an exception, a 500.
    """
    return same_secret(request.headers.get("Authorization", ""), f"Bearer {token}")


def same_secret(given: str, expected: str) -> bool:
    """Constant-time equality of two secrets, as bytes (surrogate escapes kept, never an exception)."""
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape"))


def is_loopback(remote: str | None) -> bool:
    try:
        ip = ipaddress.ip_address(remote or "")
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 from a dual-stack socket
    return ip.is_loopback


def check_control(request: web.Request, token: str | None, setting: str) -> None:
    """Raise ``Unauthorized``/``Forbidden`` unless the caller may use a control route.

    ``setting`` names where the token is configured, for the message.
    """
    if token:
        if not has_bearer(request, token):
            raise Unauthorized(f"this route needs `Authorization: Bearer <{setting}>`")
    elif not is_loopback(request.remote):
        raise Forbidden(f"control routes are open to loopback clients only; set {setting} to allow "
                        "others (they then send it as `Authorization: Bearer <token>`)")


def control_route(handler: Handler, token: Callable[[web.Request], str | None], setting: str,
                  *, vllm: bool = False) -> Handler:
    """``handler`` behind ``check_control``; a ``ClawproxyError`` it raises becomes its JSON error."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            check_control(request, token(request), setting)
            return await handler(request)
        except ClawproxyError as err:
            return error_response(err, vllm=vllm)

    guarded.__name__ = getattr(handler, "__name__", "guarded")
    return guarded
