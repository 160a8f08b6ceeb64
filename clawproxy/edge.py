"""The HTTP edge the proxy and the embedded engine share: one way to answer an error, one guard
for control routes.

Both servers raise ``ClawproxyError`` (clawproxy/errors.py) and answer it with ``error_response``;
both put their control routes behind ``control_route``: open to loopback clients when no token is
set, otherwise to whoever sends ``Authorization: Bearer <token>`` (compared in constant time).

DNS rebinding: a web page on ``evil.example`` whose name then resolves to 127.0.0.1 reaches a
loopback server from the user's own browser, with the source address of a loopback client. So a
server that passes ``hosts`` also refuses any ``Host`` but a loopback name, an IP address (a
rebinding page always arrives under its own DNS name) or one of ``hosts``; Jupyter's server applies
the same rule. Actions (POST) also need a same-origin ``Origin`` or ``Sec-Fetch-Site`` (``same_origin``).
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable, Collection
from urllib.parse import urlsplit

import orjson
from aiohttp import web

from clawproxy.errors import ClawproxyError, Forbidden, RequestError, Unauthorized, error_body

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(err: ClawproxyError, *, vllm: bool = False) -> web.Response:
    """``err`` as a JSON error with its HTTP status (``vllm``: in vLLM's dialect, see ``error_body``)."""
    headers = {"Retry-After": str(err.retry_after)} if err.retry_after is not None else {}
    if err.status == 401:
        headers["WWW-Authenticate"] = "Bearer"  # RFC 9110: a 401 names the scheme that would work
    return web.Response(status=err.status, body=orjson.dumps(error_body(err, vllm=vllm)),
                        content_type="application/json", headers=headers)


SQLITE_INT_MAX = 2**63 - 1


def query_int(request: web.Request, name: str, default: int, *, ge: int = 0,
              le: int = SQLITE_INT_MAX) -> int:
    """Query parameter ``name`` as an int in [ge, le] (SQLite's range by default), else ``RequestError``."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not ge <= value <= le:
        raise RequestError(f"query parameter {name}={raw[:40]!r} must be an integer from {ge} to {le}.",
                           param=name, code="invalid_query")
    return value


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


def host_name(host: str | None) -> str | None:
    """The name in a ``Host`` header (``[::1]:8080`` -> ``::1``), lowercased; None if it has none."""
    try:
        name = urlsplit("//" + (host or "")).hostname
    except ValueError:  # an unbalanced "[" and the like
        return None
    return name or None


def host_allowed(host: str | None, names: Collection[str]) -> bool:
    """Whether ``host`` (a Host header) names this server: loopback, an IP address, or ``names``."""
    name = host_name(host)
    if name is None:
        return False
    if name == "localhost" or name.endswith(".localhost") or name in names:
        return True  # RFC 6761: *.localhost is loopback, and no one can register it
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def same_origin(request: web.Request) -> bool:
    """Whether a browser says the request comes from a page of this very origin.

    ``Sec-Fetch-Site`` other than ``same-origin`` refuses; an ``Origin`` must equal
    ``http(s)://<Host>``; a request with neither is refused (browsers send one of them on every POST).
    """
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site != "same-origin":
        return False
    origin = request.headers.get("Origin")
    if origin is None:
        return site == "same-origin"
    try:
        o = urlsplit(origin)
    except ValueError:
        return False
    return (o.scheme in ("http", "https") and not o.path and not o.query
            and o.netloc.lower() == request.headers.get("Host", "").lower())


def check_control(request: web.Request, token: str | None, setting: str,
                  hosts: Collection[str] | None = None) -> None:
    """Raise ``Unauthorized``/``Forbidden`` unless the caller may use a control route.

    ``setting`` names where the token is configured, for the message. ``hosts``: the configured
    Host names (see the module docstring); None skips the Host check.
    """
    if token:
        if not has_bearer(request, token):
            raise Unauthorized(f"this route needs `Authorization: Bearer <{setting}>`")
    elif not is_loopback(request.remote):
        raise Forbidden(f"control routes are open to loopback clients only; set {setting} to allow "
                        "others (they then send it as `Authorization: Bearer <token>`)")
    host = request.headers.get("Host")
    # No Host at all is an HTTP/1.0 tool, never a browser: only a browser can be rebound.
    if hosts is not None and host and not host_allowed(host, hosts):
        raise Forbidden(f"Host {host!r} is not a name this server answers to on its control routes "
                        "(a DNS-rebinding guard); use 127.0.0.1 or localhost, or add the name to "
                        "proxy.allowed_hosts", code="host_not_allowed")


def control_route(handler: Handler, token: Callable[[web.Request], str | None], setting: str,
                  *, vllm: bool = False,
                  hosts: Callable[[web.Request], Collection[str]] | None = None) -> Handler:
    """``handler`` behind ``check_control``; a ``ClawproxyError`` it raises becomes its JSON error."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            check_control(request, token(request), setting, hosts(request) if hosts else None)
            return await handler(request)
        except ClawproxyError as err:
            return error_response(err, vllm=vllm)

    guarded.__name__ = getattr(handler, "__name__", "guarded")
    return guarded
