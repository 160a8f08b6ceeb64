"""What the proxy reads from and writes to the wire: request bodies (bounded, decompressed,
validated), the body that goes upstream (``Outgoing``: parsed once, changed by the addons,
serialized once) and headers (hop-by-hop dropped), kept apart from the forwarding in ``app.py``."""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from multidict import CIMultiDict, CIMultiDictProxy

from clawproxy.errors import RequestError
from clawproxy.proxy.sse import Added

# RFC 9110 §7.6.1 hop-by-hop headers, plus what aiohttp recomputes (length, encoding, host).
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host", "content-length",
    "content-encoding", "accept-encoding",
})


def request_headers(h: CIMultiDictProxy[str], drop_auth: bool = False,
                     upstream_token: str | None = None) -> CIMultiDict[str]:
    out = end_to_end_headers(h)
    # Compression buys nothing on loopback and costs CPU per chunk; aiohttp still decodes it
    # if an upstream compresses anyway.
    out["Accept-Encoding"] = "identity"
    if drop_auth:  # it carried the proxy's own token or a user's key
        out.popall("Authorization", None)
        if upstream_token:  # the user's key replaced the one vLLM wants
            out["Authorization"] = f"Bearer {upstream_token}"
    return out


def end_to_end_headers(h: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """``h`` without hop-by-hop headers, including those named by its Connection header."""
    drop = {t.strip().lower() for t in h.get("Connection", "").split(",") if t.strip()}
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in h.items():
        lk = k.lower()
        if lk not in HOP_BY_HOP and lk not in drop:
            out.add(k, v)
    return out


def splice_fields(body: bytes, fields: dict[str, Any]) -> bytes:
    """``body`` (a JSON object) with new top-level ``fields`` written in, without re-serializing it."""
    added = b",".join(orjson.dumps(k) + b":" + orjson.dumps(v) for k, v in fields.items())
    i = body.index(b"{") + 1
    rest = body[i:]
    sep = b"" if rest.lstrip().startswith(b"}") else b","
    return body[:i] + added + sep + rest


class Outgoing:
    """The request as it goes upstream; the rewriting addons change it (``tap.py``'s hooks).

    ``obj`` is the chat body, parsed once (``parse_chat_body``); another body is parsed only if an
    addon asks (``json``). Addons replace top-level fields through ``set``/``unset``, never change
    a value in place: the turn records the client's body, which shares the nested values.
    ``payload`` serializes once per upstream request: the client's bytes when nothing changed, its
    bytes with the new fields spliced in when only new fields were added (the common case: the
    token fields), else the whole object.
    """

    __slots__ = ("_new", "_obj", "_old", "_parsed", "added", "chat", "drop_auth", "headers", "method",
                 "notes", "path", "raw", "routed_version", "served", "upstream_token", "user")

    def __init__(self, method: str, path: str, headers: CIMultiDictProxy[str], raw: bytes,
                 obj: dict[str, Any] | None, user: str | None, drop_auth: bool):
        self.method, self.path, self.headers, self.raw, self.user = method, path, headers, raw, user
        self.chat = obj is not None  # a chat completion, its body parsed and valid
        self._obj: dict[str, Any] | None = dict(obj) if obj is not None else None
        self._parsed = obj is not None
        self._new: dict[str, None] = {}  # top-level fields the client did not send, in order
        self._old = False  # a field the client sent was replaced or removed
        self.drop_auth = drop_auth  # the client's Authorization is not the upstream's
        self.upstream_token: str | None = None  # sent as the upstream's bearer token instead
        self.added = Added()  # the token fields asked for: stripped from the answer (``tap.py``)
        self.routed_version: int | None = None  # the weight version the request was routed to
        self.served: Any = None  # the instruction it was served under (``trying.Served``)
        self.notes: dict[str, Any] = {}  # each addon's own state for this request, by its name

    @property
    def obj(self) -> dict[str, Any] | None:
        """The chat body (None for another request until ``json`` parsed it)."""
        return self._obj

    def json(self) -> dict[str, Any] | None:
        """The body as a JSON object (parsed at most once), or None if it is not one."""
        if not self._parsed:
            self._parsed = True
            try:
                obj = orjson.loads(self.raw) if self.raw else None
            except orjson.JSONDecodeError:
                obj = None
            self._obj = obj if isinstance(obj, dict) else None
        return self._obj

    def set(self, key: str, value: Any) -> None:
        obj = self.json()
        assert obj is not None, "set() on a body that is not a JSON object"
        if key in obj and key not in self._new:
            self._old = True
        else:
            self._new[key] = None
        obj[key] = value

    def unset(self, key: str) -> None:
        obj = self.json()
        if obj is None or key not in obj:
            return
        del obj[key]
        if key in self._new:
            del self._new[key]
        else:
            self._old = True

    def payload(self) -> bytes:
        """The body to send upstream now."""
        if self._obj is None or not (self._old or self._new):
            return self.raw
        if not self._old:
            return splice_fields(self.raw, {k: self._obj[k] for k in self._new})
        return orjson.dumps(self._obj)


def parse_chat_body(request: web.Request, body: bytes) -> dict[str, Any]:
    ctype = request.content_type
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise RequestError(f"Content-Type must be application/json, got {ctype or 'none'!r}.",
                           status=415, code="unsupported_media_type")
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as ue:
            raise RequestError(f"request body is not valid UTF-8 (byte {ue.start}).",
                               code="invalid_utf8") from None
        raise RequestError(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise RequestError("request body must be a JSON object.", code="invalid_json")
    if not isinstance(obj.get("messages"), list):
        raise RequestError("'messages' must be an array of messages.", code="invalid_messages")
    return obj


UNREAD_BODY = frozenset({"request_timeout", "request_too_large", "invalid_content_encoding",
                          "invalid_body"})


def _too_large(limit: int) -> RequestError:
    return RequestError(f"request body exceeds the {limit}-byte limit (proxy.max_body_bytes), "
                        "after decompression.", status=413, code="request_too_large")


async def read_body(request: web.Request, limit: int, timeout: float) -> bytes:
    """The request body, decompressed, at most ``limit`` bytes, within ``timeout`` seconds."""
    if request.content_length is not None and request.content_length > limit:
        raise RequestError(f"request body of {request.content_length} bytes exceeds the "
                           f"{limit}-byte limit (proxy.max_body_bytes).", status=413,
                           code="request_too_large")
    coding = request.headers.get("Content-Encoding", "").strip().lower()
    # A server run without server_options() has aiohttp decompress (it marks the stream so).
    if coding in ("", "identity") or getattr(request.content, "total_compressed_bytes", None) is not None:
        coding = ""
    elif coding not in ("gzip", "x-gzip", "deflate"):
        raise RequestError(f"Content-Encoding {coding!r} is not supported; send the body "
                           "uncompressed, gzip or deflate.", status=415,
                           code="unsupported_content_encoding")
    try:
        async with asyncio.timeout(timeout):
            return await _read_decoded(request.content, coding, limit)
    except TimeoutError:
        raise RequestError(f"the request body did not arrive within {timeout:g} s "
                           "(proxy.body_timeout_s).", status=408, code="request_timeout") from None
    except HttpProcessingError as e:
        raise RequestError(f"malformed request body: {e.message}", code="invalid_body") from None


async def _read_decoded(stream: aiohttp.StreamReader, coding: str, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    dec = None
    if coding:
        # gzip: header autodetected (32+); deflate: zlib-wrapped (15) or raw (-15), decided below.
        dec = zlib.decompressobj(47 if coding != "deflate" else 15)
        first = True
    while chunk := await stream.readany():
        if dec is None:
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            parts.append(chunk)
            continue
        if first and coding == "deflate" and chunk[0] & 0x0F != 8:
            dec = zlib.decompressobj(-15)  # raw deflate, as many clients send it
        first = False
        data = chunk
        while data:  # decompress in bounded steps: a 200 MB bomb stops at limit + 1 bytes
            try:
                out = dec.decompress(data, limit + 1 - size)
            except zlib.error as e:
                raise RequestError(f"request body is not valid {coding} data ({e}); drop the "
                                   "Content-Encoding header or compress the body.",
                                   code="invalid_content_encoding") from None
            size += len(out)
            if size > limit:
                raise _too_large(limit)
            parts.append(out)
            data = dec.unconsumed_tail
            if data:
                await asyncio.sleep(0)  # a long inflate must not starve the other requests
        if dec.eof:
            break
    if dec is not None and not dec.eof:
        raise RequestError(f"request body is truncated {coding} data.",
                           code="invalid_content_encoding")
    return b"".join(parts)


def int_header(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
