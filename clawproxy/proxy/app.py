"""The aiohttp application: a transparent reverse proxy for ``/v1/*`` that records chat turns.

This module only moves bytes. Per request: read the body, parse and validate a chat body (once),
let the addons change the request (``addons.py``: routing, trying, the token fields, in their
declared order, over ``wire.Outgoing``), serialize it once, open the upstream request, then pass
every upstream read to the client through the request's ``Tap`` (``tap.py``), which strips the
fields we added, builds the turn as its events pass (one orjson parse per event) and decides the
outcome once. The watching addons see the tap's events: recording, stats, metrics. The proxy's own
endpoints are ``control.py``. The turn is journaled, redacted,
before ``[DONE]`` goes out; that redaction runs on the event loop (the request body's while the
upstream generates, the answer's at the end, tens of microseconds with the body's messages
cached). Building the stored record, its redaction again, session tracking and SQLite happen
later in the recorder's thread (``recorder.py``).

``create_app`` is self-contained: ``clawproxy start`` (the supervisor), ``run_proxy`` and the tests
all call it and run the app with ``server_options``.
"""

from __future__ import annotations

import asyncio
import fnmatch
import itertools
import logging
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import unquote

import aiohttp
import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from yarl import URL

from clawproxy.config import Config
from clawproxy.edge import error_response, has_bearer
from clawproxy.errors import (
    ClawproxyError,
    ConfigError,
    NotFound,
    RequestError,
    Unauthorized,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
    error_body,
)
from clawproxy.proxy import aiohttp_patches, control, ui, wire
from clawproxy.proxy.addons import ProxyStats, Recording, TokenFields, default_addons
from clawproxy.proxy.metrics import ProxyMetrics
from clawproxy.proxy.poller import Poller
from clawproxy.proxy.recorder import Recorder
from clawproxy.proxy.routing import ModelRouter, router_for
from clawproxy.proxy.tap import Addons, Flow, Outcome, Tap
from clawproxy.proxy.trying import Trying
from clawproxy.proxy.warmup import Warmup
from clawproxy.store.lifecycle import LEARN_HEADER

log = logging.getLogger("clawproxy.proxy")

CHAT_PATHS = frozenset({"/v1/chat/completions", "/v1/chat/completions/"})
# What an OpenAI client calls. Everything else under /v1 stays unforwarded: the engine's control
# verbs (load_lora_adapter, ...) trust loopback callers, and the proxy is one.
FORWARDED_ROUTES = (
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/*", "/v1/embeddings",
    "/v1/responses", "/v1/responses/*",
)
SESSION_HEADERS = ("session_id", "x-session-affinity", "x-session-id")
RECORDED_HEADERS = (*SESSION_HEADERS, LEARN_HEADER)  # kept with the turn (the journal's "h")
SWITCH_INTERVAL_S = 0.0005


CONFIG_KEY = web.AppKey("clawproxy_config", Config)
UPSTREAM_KEY = web.AppKey("clawproxy_upstream", aiohttp.ClientSession)
RECORDER_KEY = web.AppKey("clawproxy_recorder", Recorder)
READY_KEY = web.AppKey("clawproxy_upstream_ready", object)
STATS_KEY = web.AppKey("clawproxy_stats", ProxyStats)
# Request ids: one random prefix per app start plus a counter (uuid4 per request costs a syscall).
IDS_KEY: web.AppKey[Iterator[str]] = web.AppKey("clawproxy_ids")
ROUTES_KEY: web.AppKey[Callable[[str], str | None]] = web.AppKey("clawproxy_routes")
METRICS_KEY = web.AppKey("clawproxy_metrics", ProxyMetrics)
RECORDING_KEY = web.AppKey("clawproxy_recording", Recording)
ADDONS_KEY = web.AppKey("clawproxy_addons", Addons)
TRYING_KEY = web.AppKey("clawproxy_trying", Trying)
POLLER_KEY = web.AppKey("clawproxy_poller", Poller)
WARMUP_KEY = web.AppKey("clawproxy_warmup", Warmup)


def server_options(cfg: Config) -> dict[str, Any]:
    """How the aiohttp server that runs ``create_app`` must be set up (runner / TestServer kwargs).

    The proxy decompresses request bodies itself, bounded while streaming; ``keepalive_timeout``
    also closes a connection that has not sent a complete request in that time (aiohttp arms it
    when the connection opens), which bounds slow or stuck headers. ``handler_cancellation``: a
    client that hangs up cancels its handler, which closes the upstream request (the generation
    stops) and records the turn as aborted.
    """
    # lingering_time: after an early 4xx, aiohttp drains the unread body so the client sees the
    # answer rather than a reset; bounded, since a slow client would keep the connection.
    return {"auto_decompress": False, "keepalive_timeout": cfg.proxy.header_timeout_s,
            "lingering_time": 1.0, "handler_cancellation": True}


def _route_matcher(extra: list[str]) -> Callable[[str], str | None]:
    """``route(raw_path)``: the whitelist pattern that admits the path, or None (not forwarded).
    A ``*`` matches within one path segment only."""
    pats = [*FORWARDED_ROUTES, *extra]
    exact = frozenset(p for p in pats if not any(c in p for c in "*?["))
    globs = [(p, re.compile(fnmatch.translate(p).replace(".*", "[^/]*"))) for p in pats if p not in exact]

    def route(raw_path: str) -> str | None:
        path = raw_path.split("?", 1)[0]
        # Dot segments (also percent-encoded) could reach another route once the upstream decodes.
        if "." in path or "%" in path:
            if {".", ".."} & set(unquote(path).replace("\\", "/").split("/")):
                return None
        path = path.rstrip("/") or "/"
        if path in exact:
            return path
        return next((p for p, g in globs if g.match(path)), None)

    return route


class _ParserNoise(logging.Filter):
    """aiohttp logs every request its parser rejects as an ERROR with a traceback; a fuzzer or a
    port scanner would fill the log. They are the client's problem: one line at debug level."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.msg = f"{record.getMessage()}: {type(exc).__name__}: {exc}"
            record.args, record.exc_info, record.exc_text = None, None, None
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


_PARSER_NOISE = _ParserNoise()


def _install_log_filters() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if _PARSER_NOISE not in server_log.filters:
        server_log.addFilter(_PARSER_NOISE)


ROUTER_KEY = web.AppKey("clawproxy_router", ModelRouter)


class NotReadyLog:
    """The 503s of one period the model server is not ready: the first at WARNING, the rest at
    DEBUG, their count at INFO once the upstream answers again (clients that poll a starting
    engine would otherwise log hundreds of identical lines)."""

    def __init__(self) -> None:
        self.refused = 0  # 503s since the upstream last answered

    def refuse(self, err: UpstreamUnavailable) -> None:
        self.refused += 1
        if self.refused == 1:
            log.warning("upstream failure (%d): %s (further 503s at debug level until it answers)",
                        err.status, err.message)
        else:
            log.debug("upstream failure (%d): %s", err.status, err.message)

    def answered(self) -> None:
        if self.refused:
            log.info("the model server answers; %d request(s) got 503 while it was not ready", self.refused)
            self.refused = 0


NOT_READY_KEY = web.AppKey("clawproxy_not_ready_log", NotReadyLog)


def create_app(cfg: Config, *, upstream_ready: Callable[[], bool] | None = None) -> web.Application:
    """Build the proxy application for ``cfg.proxy.upstream``.

    ``upstream_ready``: when given and it returns False while the upstream refuses connections
    (the embedded engine is restarting), clients get 503 with ``Retry-After: 1`` instead of 502.
    """
    if not cfg.proxy.upstream:
        raise ConfigError("the proxy needs proxy.upstream (e.g. --upstream http://127.0.0.1:8000).")
    app = web.Application(client_max_size=cfg.proxy.max_body_bytes)
    _install_log_filters()
    aiohttp_patches.install()
    app[aiohttp_patches.PROTOCOL_ERRORS] = _protocol_error
    if not cfg.proxy.is_loopback:
        log.warning("the proxy listens on %s, off loopback: every request must carry "
                    "`Authorization: Bearer <proxy.control_token>`; anyone who has the token can "
                    "use the model and read nothing else", cfg.proxy.host)
    app[CONFIG_KEY] = cfg
    app[ROUTES_KEY] = _route_matcher(cfg.proxy.extra_routes)
    app[READY_KEY] = upstream_ready
    app[NOT_READY_KEY] = NotReadyLog()
    app[STATS_KEY] = ProxyStats(started_at=time.time())
    app[METRICS_KEY] = ProxyMetrics(lambda: app[RECORDER_KEY].stats(), lambda: app[STATS_KEY],
                                    cfg.db_path)
    app.on_cleanup.append(_close_metrics)
    app[RECORDING_KEY] = Recording()
    # only in front of the engine clawproxy runs: an attached server's cache is its own business
    warmup = Warmup(cfg, app[STATS_KEY], upstream_ready) if upstream_ready is not None and cfg.engine.warm_prefix \
        else None
    app[ROUTER_KEY] = router_for(cfg)
    app[TRYING_KEY] = Trying(cfg)
    app[ADDONS_KEY] = Addons(default_addons(app[STATS_KEY], app[RECORDING_KEY], app[METRICS_KEY], app[ROUTER_KEY],
                                            app[TRYING_KEY], TokenFields(cfg.proxy.record_tokens), warmup))
    prefix = uuid.uuid4().hex[:16]
    app[IDS_KEY] = (f"{prefix}-{i}" for i in itertools.count(1))
    app.cleanup_ctx.append(_recorder_ctx)
    app.cleanup_ctx.append(_upstream_ctx)  # cleaned up first: no request outlives the recorder
    # after the recorder's context, which migrates the store the poller reads
    app[POLLER_KEY] = Poller(cfg.db_path, [app[ROUTER_KEY], app[TRYING_KEY]])
    app.cleanup_ctx.append(app[POLLER_KEY].ctx)
    if warmup is not None:
        app[WARMUP_KEY] = warmup
        app.cleanup_ctx.append(lambda app: warmup.ctx(app[ROUTER_KEY], app[UPSTREAM_KEY]))
    control.setup(app, control.Control(cfg, upstream_ready, app[STATS_KEY], lambda: app[RECORDER_KEY].stats(),
                                       app[METRICS_KEY]))
    ui.setup(app, cfg, recording=lambda: app[RECORDER_KEY].stats())
    app.router.add_route("*", "/v1/{tail:.*}", forward)
    app.router.add_route("*", "/v1", forward)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


def run_proxy(cfg: Config, *, upstream_ready: Callable[[], bool] | None = None) -> None:
    """Serve the proxy on cfg.proxy.host:port until interrupted."""
    from clawproxy import aio

    web.run_app(
        create_app(cfg, upstream_ready=upstream_ready),
        loop=aio.new_event_loop(),
        host=cfg.proxy.host,
        port=cfg.proxy.port,
        access_log=None,
        **server_options(cfg),
        print=lambda *_: log.info("proxy on http://%s:%d/v1 -> %s (%s)", cfg.proxy.host,
                                  cfg.proxy.port, cfg.proxy.upstream, aio.loop_name()),
    )


async def _recorder_ctx(app: web.Application) -> AsyncIterator[None]:
    # The recorder thread shares the GIL with the event loop. With CPython's default 5 ms switch
    # interval, every socket call the loop makes while the recorder parses can wait up to 5 ms
    # for the GIL (the convoy effect), which shows up directly as per-chunk latency.
    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
    recorder = Recorder(app[CONFIG_KEY], busy=lambda: app[STATS_KEY].in_flight > 0)
    await recorder.start()
    app[RECORDER_KEY] = app[RECORDING_KEY].recorder = recorder
    yield
    await recorder.close()


async def _close_metrics(app: web.Application) -> None:
    await asyncio.to_thread(app[METRICS_KEY].close)  # waits for a scrape still reading the store


async def _upstream_ctx(app: web.Application) -> AsyncIterator[None]:
    p = app[CONFIG_KEY].proxy
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=p.connect_timeout_s,
                                    sock_read=p.read_timeout_s)
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector,
                                     auto_decompress=True) as session:
        app[UPSTREAM_KEY] = session
        yield


async def not_found(request: web.Request) -> web.Response:
    return error_response(NotFound(f"{request.path} is not served here: the API is under /v1/, the "
                                   "proxy's own endpoints under /clawproxy/"))


def _not_forwarded(request: web.Request) -> web.Response:
    return error_response(NotFound(
        f"{request.path} is not forwarded by clawproxy (it serves chat/completions, completions, "
        "models, embeddings, responses; add more with proxy.extra_routes). Engine control verbs "
        "are only on the engine's own port."))


# -- helpers -------------------------------------------------------------------------------------
def _protocol_error(status: int, message: str | None, exc: BaseException | None) -> web.StreamResponse:
    """What aiohttp's protocol layer answers itself (aiohttp_patches.py), as the OpenAI JSON error
    our clients parse; the connection is closed, as aiohttp would."""
    if status < 500:
        err: ClawproxyError = RequestError(f"malformed HTTP request: {(message or str(exc or ''))[:300]}",
                                           status=status, code="invalid_http")
    else:
        err = _INTERNAL if status == 500 else ClawproxyError("the request took too long", status=status)
    out = error_response(err)
    out.force_close()
    return out


# -- the forwarding handler: IO only; what happened goes to the request's tap (tap.py) ------------
async def forward(request: web.Request) -> web.StreamResponse:
    app = request.app
    chat = request.method == "POST" and request.path in CHAT_PATHS
    tap = Tap(app[ADDONS_KEY], Flow(request.method, request.path, app[ROUTES_KEY](request.raw_path), chat))
    resp: web.StreamResponse | None = None
    try:
        resp = await _forward(request, tap)
        return resp
    finally:
        tap.close(resp.status if resp is not None else None)


async def _forward(request: web.Request, tap: Tap) -> web.StreamResponse:
    """Check the caller, then one exchange with the upstream.

    Every way out of the exchange tells the tap, and the ``finally`` ends the turn there (the first
    outcome wins; the recorder journals the turn), whatever happened: client hang-up, upstream
    failure, bad body, a bug of ours. A stream's last read (the one that holds ``[DONE]``) is sent
    only after that, so a turn the client saw finish is journaled.
    """
    app = request.app
    cfg = app[CONFIG_KEY]
    off_loopback = not cfg.proxy.is_loopback
    try:
        control_ok = not off_loopback or has_bearer(request, cfg.proxy.control_token or "")
        caller = app[ADDONS_KEY].identify(request.headers, control_ok)
        if caller is None and not control_ok:
            raise Unauthorized("this proxy needs `Authorization: Bearer <proxy.control_token>`")
    except Unauthorized as e:
        tap.refuse(e.status, e.message)
        return error_response(e)
    user = caller.user if caller is not None else None
    if tap.flow.route is None:
        out = _not_forwarded(request)
        tap.refuse(out.status, "not forwarded")
        return out
    ids: Iterator[str] = app[IDS_KEY]
    tap.admit(next(ids) if tap.flow.chat else "",
              {k: v for k in RECORDED_HEADERS if (v := request.headers.get(k))}, user)
    end: _StreamEnd | None = None
    try:
        # the proxy's token or a user's key never goes upstream
        resp, end = await _exchange(request, tap, off_loopback or caller is not None, user)
    except asyncio.CancelledError:  # the client hung up (server_options: handler_cancellation)
        tap.client_left("client disconnected" if tap.flow.start is not None
                        else "client disconnected while sending the body")
        raise
    except ClawproxyError as e:  # the client's request or the upstream failed: a JSON error
        if isinstance(e, UpstreamUnavailable):
            request.app[NOT_READY_KEY].refuse(e)
        elif isinstance(e, UpstreamError):
            log.warning("upstream failure (%d): %s", e.status, e.message)
        tap.fail(e.status, e.message)
        resp = error_response(e)
        if e.code in wire.UNREAD_BODY:
            resp.force_close()  # the rest of the body is still on the wire: drop the connection
    except Exception as e:  # a bug of ours: logged with its traceback, the client gets JSON
        log.exception("proxy error on %s %s", request.method, request.path)
        tap.fail(500, f"proxy error: {type(e).__name__}: {e}")
        resp = error_response(_INTERNAL)
        resp.force_close()
    finally:
        tap.end_turn()
    if end is not None:
        await end.send(tap)
    return resp


_INTERNAL = ClawproxyError("internal proxy error; see the clawproxy log")


async def _exchange(request: web.Request, tap: Tap, drop_auth: bool,
                    user: str | None = None) -> tuple[web.StreamResponse, _StreamEnd | None]:
    """Read the client's body, let the addons change the request, ask the upstream, relay its answer.

    A whole answer may have an addon ask again (``retry``), with the request as it changed it.
    """
    app = request.app
    cfg = app[CONFIG_KEY]
    addons = app[ADDONS_KEY]
    body = await wire.read_body(request, cfg.proxy.max_body_bytes, cfg.proxy.body_timeout_s)
    tap.body(body)
    obj = None
    if tap.flow.chat:
        obj = wire.parse_chat_body(request, body)
        tap.chat_body(obj)
    req = wire.Outgoing(request.method, request.path, request.headers, body, obj, user, drop_auth)
    addons.rewrite(req)
    while True:
        tap.sending(req)
        up = await _ask(request, req, tap)
        addons.answered(req, up.status)
        if up.headers.get("Content-Type", "").startswith("text/event-stream"):
            tap.response(up.status, wire.int_header(up.headers.get("x-weight-version")), True, req.added)
            return await _stream(request, up, tap)
        data = await _read_answer(request, up, tap)
        if not await addons.retry(req, up.status, data):
            break
    tap.response(up.status, wire.int_header(up.headers.get("x-weight-version")), False, req.added)
    data = addons.reply(req, up.status, tap.answer(data))
    return web.Response(status=up.status, body=data, headers=wire.end_to_end_headers(up.headers)), None


async def _ask(request: web.Request, req: wire.Outgoing, tap: Tap) -> aiohttp.ClientResponse:
    """Send the request upstream; its response once the headers are in."""
    app = request.app
    url = URL((app[CONFIG_KEY].proxy.upstream or "") + request.raw_path, encoded=True)
    body = req.payload()
    t0 = time.perf_counter()
    try:
        up = await app[UPSTREAM_KEY].request(
            request.method, url, headers=wire.request_headers(request.headers, req.drop_auth, req.upstream_token),
            data=body if body or request.method in ("POST", "PUT", "PATCH") else None,
            allow_redirects=False,
        )
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        raise _upstream_error(request, e) from e
    finally:
        tap.waited(time.perf_counter() - t0)
    app[NOT_READY_KEY].answered()
    return up


async def _read_answer(request: web.Request, up: aiohttp.ClientResponse, tap: Tap) -> bytes:
    """A non-streamed answer's whole body; the upstream connection is released."""
    t0 = time.perf_counter()
    try:
        return await up.read()
    except (TimeoutError, aiohttp.ClientError) as e:
        raise _upstream_error(request, e) from e
    finally:
        tap.waited(time.perf_counter() - t0)
        up.release()


def _upstream_error(request: web.Request, exc: BaseException) -> UpstreamError:
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout("upstream did not answer in time")
    ready = request.app[READY_KEY]
    if callable(ready) and isinstance(exc, aiohttp.ClientConnectorError) and not ready():
        return UpstreamUnavailable("the model server is not ready yet (starting or restarting); retry shortly")
    return UpstreamError(f"upstream unreachable: {type(exc).__name__}: {exc}")


def _error_event(err: UpstreamError) -> bytes:
    return b"data: " + orjson.dumps(error_body(err)) + b"\n\n"


async def _stream(request: web.Request, up: aiohttp.ClientResponse, tap: Tap,
                  ) -> tuple[web.StreamResponse, _StreamEnd | None]:
    """Relay the event stream as it arrives, each read through the tap, up to the read that holds
    ``[DONE]``: that read and whatever follows are returned as a ``_StreamEnd``, sent once the
    turn is recorded. A stream that ends without ``[DONE]`` or fails gets an in-band error event
    as its end.
    """
    resp = _Relay(status=up.status, headers=wire.end_to_end_headers(up.headers))
    waiting: float | None = None  # since when we wait on the upstream, None: we don't
    try:
        await resp.prepare(request)
        # What came in with the headers goes out with them in one write; at a busy moment that is
        # the whole stream, which then goes out with the end of the response (_StreamEnd).
        data = up.content.read_nowait()
        out = tap.chunk(data) if data else b""
        if not tap.done:
            await resp.write(out)  # b"": the headers alone; they never wait for a read
            waiting = time.perf_counter()
            async for data in up.content.iter_any():
                tap.waited(time.perf_counter() - waiting)
                waiting = None
                out = tap.chunk(data)
                if tap.done:
                    break
                if out:
                    await resp.write(out)
                waiting = time.perf_counter()
            else:
                tap.waited(time.perf_counter() - waiting)
                waiting = None
                out = tap.eof()
                if tap.flow.outcome is Outcome.CUT:
                    if out:
                        await resp.write(out)
                    up.close()
                    cut = UpstreamError(tap.flow.error or "upstream closed the stream before [DONE]")
                    log.warning("%s", cut.message)
                    return resp, _StreamEnd(resp, None, _error_event(cut))
        return resp, _StreamEnd(resp, up, out)
    except asyncio.CancelledError:
        up.close()  # the client hung up: end the upstream generation now; _forward tells the tap
        raise
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):  # before ClientError
        up.close()  # cancels the upstream generation
        tap.client_left()
        return resp, None
    except (TimeoutError, aiohttp.ClientError) as e:
        # Headers are gone already: tell the client in-band, the tap the failure, end the stream.
        if waiting is not None:  # a read timeout is the upstream's time, not ours
            tap.waited(time.perf_counter() - waiting)
        up.close()
        if isinstance(e, TimeoutError):
            err: UpstreamError = UpstreamTimeout("upstream stopped sending (read timeout)")
        else:
            err = UpstreamError(f"upstream stream failed: {type(e).__name__}: {e}")
        log.warning("%s", err.message)
        tap.upstream_failed(err.message)
        return resp, _StreamEnd(resp, None, _error_event(err))


class _Relay(web.StreamResponse):
    """An event stream whose headers wait for its first bytes, to go out in one write with them
    (aiohttp's own ``Response`` opts in the same way); ``_stream`` flushes them at once when the
    upstream sent nothing with its headers yet."""

    _send_headers_immediately = False


class _StreamEnd:
    """What a stream sends after its turn is recorded: the read that held ``[DONE]`` (or an
    in-band error event), anything the upstream still sends, then the end of the response."""

    __slots__ = ("data", "resp", "up")

    def __init__(self, resp: web.StreamResponse, up: aiohttp.ClientResponse | None, data: bytes):
        self.resp, self.up, self.data = resp, up, data

    async def send(self, tap: Tap) -> None:
        try:
            if self.up is None or self.up.content.at_eof():
                # Nothing more is coming: the last read (and the headers, if they still wait)
                # goes out with the end of the response, in one write.
                await self.resp.write_eof(self.data)
                return
            if self.data:
                await self.resp.write(self.data)
            async for data in self.up.content.iter_any():
                await self.resp.write(data)
            await self.resp.write_eof()
        except (asyncio.CancelledError, ConnectionResetError) as e:  # the client left
            tap.client_left()  # its turn is recorded already, as it finished
            if self.up is not None:
                self.up.close()
            if isinstance(e, asyncio.CancelledError):
                raise
        except (TimeoutError, aiohttp.ClientError) as e:  # ClientConnectionResetError went above
            log.warning("upstream failed after the turn ended: %s: %s", type(e).__name__, e)
            if self.up is not None:
                self.up.close()
        finally:
            if self.up is not None:
                self.up.release()
