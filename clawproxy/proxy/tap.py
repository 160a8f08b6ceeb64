"""One forwarded request as events, sans IO: the tap decides its outcome once; addons listen.

The forwarding handler (``app.py``) moves bytes and tells the ``Tap`` what happened: the client
was admitted, its body arrived, the upstream answered, each read of a stream, a whole answer, a
failure, the client leaving. The tap strips the fields we added, builds the chat turn (``Capture``)
and decides the outcome (``Outcome``) at the first event that ends the exchange; later ones change
nothing, and nothing downstream works it out again. It never touches a socket, so it is tested by
feeding it events (tests/proxy/test_tap.py).

Every feature is an addon (``addons.py``, listed in ``default_addons``) with named hooks, each
hook called on the addons in the list's order. Watching hooks:

- ``request(flow)``: the client was admitted (its user known; a chat request has its capture);
- ``response(flow)``: the upstream's status and headers are in;
- ``outcome(flow)``: the outcome is decided; for a stream, before the read that holds ``[DONE]``
  goes out (the recorder journals the turn here, so a turn the client saw finish is on disk);
- ``done(flow)``: the last byte went out, or the client left.

A watching hook that raises is logged with its traceback and skipped; the request goes on.

Hooks of the features that change a request (routing, trying, the token fields), over the request
that goes upstream (``wire.Outgoing``: its body parsed once, serialized once per upstream request):

- ``identify(headers, control_ok)``: who asks; the first addon that answers a ``Caller`` decides,
  and raises ``Unauthorized`` to refuse (``control_ok``: the caller showed the control token, or
  needs none);
- ``rewrite(req)``: change the request before it first goes upstream;
- ``answered(req, status)``: the upstream's status is in (every try, a stream's too);
- ``retry(req, status, data)`` (async): a whole answer is in; True asks again with ``req`` as the
  addon changed it (the first addon that says True wins; each retries at most once by its own note);
- ``reply(req, status, data)``: a whole answer's bytes for the client.

A changing hook that raises fails its own request (500): a request sent half-changed could reach
another user's adapter. It never affects another request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import orjson

from clawproxy.proxy.sse import Added, Assembled, StreamTap, assemble_obj, strip_obj

if TYPE_CHECKING:
    from multidict import CIMultiDictProxy

    from clawproxy.proxy.wire import Outgoing

log = logging.getLogger("clawproxy.proxy")

_ERROR_TEXT_BYTES = 2000  # of an upstream's error body, kept as the turn's error


class Outcome(StrEnum):
    """How one exchange ended, decided once."""

    OK = "ok"  # the upstream's answer went out whole, and it was an answer
    ERROR = "error"  # refused, failed upstream or here, or the upstream answered with an error
    ABORTED = "aborted"  # the client left before its answer ended
    CUT = "cut"  # the upstream ended a 2xx event stream without its [DONE]

    @property
    def recorded(self) -> str:
        """The status a turn is stored with (the store knows ok, error and aborted)."""
        return "error" if self is Outcome.CUT else self.value


@dataclass(slots=True)
class Capture:
    """What the request path saw of one chat-completions call; filled by the tap only."""

    request_id: str
    created_at: float
    path: str
    t0: float  # perf_counter at arrival
    body: dict[str, Any] | None = None
    raw_body: bytes = b""  # the client's body as received (journaled; ``body`` is its parse)
    session_headers: dict[str, str] = field(default_factory=dict)
    stream: bool = False
    done: bool = False  # the stream's [DONE] arrived
    http_status: int | None = None
    status: str = "ok"
    error: str | None = None
    chunks: list[bytes] = field(default_factory=list)  # the upstream's bytes, as received
    assembled: Assembled | None = None  # the answer, as the tap built it (2xx only)
    header_weight_version: int | None = None
    t_first: float | None = None
    t_end: float | None = None
    redacted: bool = False  # the journal already redacted this turn (its token ids must go)
    user: str | None = None  # who asked (clawproxy/users.py); None: a proxy with no users
    routed_version: int | None = None  # the weight version the router sent it to (None: not routed)
    journal_body: tuple[bytes, bool] | None = None  # the body redacted early: (bytes, changed)
    served: Any = None  # trying.Served: the instruction added upstream (None: the client's body as sent)

    def finish(self, status: str, http_status: int | None = None, error: str | None = None) -> bool:
        """End the turn as ``status`` ("ok", "error", "aborted"); the first call wins, later ones
        change nothing. True if this call ended it."""
        if self.t_end is not None:
            return False
        self.t_end = time.perf_counter()
        self.status, self.error = status, error
        if http_status is not None:
            self.http_status = http_status
        return True


def clean_header(value: str) -> str:
    """A header value as text: bytes that were not UTF-8 (surrogate-escaped by aiohttp) become U+FFFD."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclass(slots=True)
class Flow:
    """One forwarded request, as addons see it."""

    method: str
    path: str
    route: str | None  # the whitelist pattern that admitted it (None: not forwarded)
    chat: bool  # a chat completion: recorded as a turn
    user: str | None = None
    admitted: bool = False  # the client may use the API (else it was refused at the door)
    capture: Capture | None = None
    start: float | None = None  # perf_counter when the body was in: the proxy's work starts
    upstream_s: float | None = None  # time spent waiting on the upstream; None: never asked
    http_status: int | None = None  # the upstream's status
    weight_version: int | None = None  # x-weight-version on the upstream's answer
    outcome: Outcome | None = None
    error: str | None = None
    client_left: bool = False  # the client left, also after its turn ended (metrics' "aborted")
    status_sent: int | None = None  # the HTTP status the client got


class Addon(Protocol):
    """Any subset of the hooks; a missing one is skipped (see the module docstring)."""


class Caller(NamedTuple):
    """Who asks, as an ``identify`` hook found them (None: a proxy with no users)."""

    user: str | None


HOOKS = ("request", "response", "outcome", "done", "identify", "rewrite", "answered", "retry", "reply")


class Addons:
    """The addons' hooks, looked up once; ``call`` isolates each watching hook's failure."""

    def __init__(self, addons: Sequence[object]):
        self.addons = list(addons)
        self._hooks = {h: [getattr(a, h) for a in self.addons if callable(getattr(a, h, None))]
                       for h in HOOKS}

    def call(self, hook: str, flow: Flow) -> None:
        for fn in self._hooks[hook]:
            try:
                fn(flow)
            except Exception:  # a watcher's bug never fails the user's request
                log.exception("addon hook %s failed on %s %s; the request goes on",
                              getattr(fn, "__qualname__", hook), flow.method, flow.path)

    def identify(self, headers: CIMultiDictProxy[str], control_ok: bool) -> Caller | None:
        for fn in self._hooks["identify"]:
            if (caller := fn(headers, control_ok)) is not None:
                return caller
        return None

    def rewrite(self, req: Outgoing) -> None:
        for fn in self._hooks["rewrite"]:
            fn(req)

    def answered(self, req: Outgoing, status: int) -> None:
        for fn in self._hooks["answered"]:
            fn(req, status)

    async def retry(self, req: Outgoing, status: int, data: bytes) -> bool:
        for fn in self._hooks["retry"]:
            if await fn(req, status, data):
                return True
        return False

    def reply(self, req: Outgoing, status: int, data: bytes) -> bytes:
        for fn in self._hooks["reply"]:
            data = fn(req, status, data)
        return data


class Tap:
    """One request's events in, bytes for the client out, the outcome decided once."""

    __slots__ = ("_addons", "_answer_ended", "_stream", "_strip", "flow")

    def __init__(self, addons: Addons, flow: Flow):
        self._addons = addons
        self.flow = flow
        self._strip = Added()
        self._stream: StreamTap | None = None
        self._answer_ended = False

    # -- the request -------------------------------------------------------------------------------
    def refuse(self, status: int, error: str) -> None:
        """The client may not use the API (no token, a path not forwarded)."""
        self._addons.call("request", self.flow)
        self._decide(Outcome.ERROR, status, error)

    def admit(self, request_id: str, headers: dict[str, str], user: str | None) -> None:
        """The client may use the API; a chat request gets its capture (``headers``: its session's)."""
        f = self.flow
        f.user = user
        f.admitted = True
        if f.chat:
            f.capture = Capture(request_id, time.time(), f.path, time.perf_counter(),
                                session_headers={k: clean_header(v) for k, v in headers.items()},
                                user=user)
        self._addons.call("request", f)

    def body(self, raw: bytes) -> None:
        """The client's body is in: the proxy's own work starts."""
        f = self.flow
        f.start = time.perf_counter()
        if f.capture is not None:
            f.capture.raw_body = raw

    def chat_body(self, parsed: dict[str, Any]) -> None:
        """The chat body, parsed and valid."""
        if self.flow.capture is not None:
            self.flow.capture.body = parsed

    def sending(self, req: Outgoing) -> None:
        """The request goes upstream as the addons changed it: where it was routed, what it was served under."""
        if self.flow.capture is not None:
            self.flow.capture.routed_version = req.routed_version
            self.flow.capture.served = req.served

    def waited(self, seconds: float) -> None:
        """Time spent waiting on the upstream (connect, headers, a read)."""
        self.flow.upstream_s = (self.flow.upstream_s or 0.0) + seconds

    # -- the answer --------------------------------------------------------------------------------
    def response(self, status: int, weight_version: int | None, stream: bool, strip: Added) -> None:
        """The upstream answered; ``strip``: the fields we added (stripped from a 2xx answer)."""
        f = self.flow
        f.http_status = status
        f.weight_version = weight_version
        self._strip = strip if status < 400 else Added()
        cap = f.capture
        if cap is not None:
            cap.http_status = status
            cap.header_weight_version = weight_version
        if stream:
            self._stream = StreamTap(self._strip, keep=cap is not None)
            if cap is not None and self._stream.chunks is not None:
                cap.stream = True
                cap.chunks = self._stream.chunks
        self._addons.call("response", f)

    def chunk(self, data: bytes) -> bytes:
        """One read of the upstream's event stream in; the bytes to send the client now out."""
        assert self._stream is not None
        out = self._stream.feed(data)
        cap = self.flow.capture
        if cap is not None and cap.t_first is None and self._stream.generated:
            cap.t_first = time.perf_counter()
        return out

    @property
    def done(self) -> bool:
        """The stream's ``[DONE]`` went through ``chunk``: that read waits for the outcome."""
        return self._stream is not None and self._stream.done

    def eof(self) -> bytes:
        """The upstream ended the stream: its unfinished last event out. A 2xx stream without
        ``[DONE]`` is cut."""
        assert self._stream is not None
        out = self._stream.close()
        self._answer_ended = True
        status = self.flow.http_status
        if not self._stream.done and status is not None and status < 400:
            self._decide(Outcome.CUT, error="upstream closed the stream before [DONE]")
        return out

    def answer(self, data: bytes) -> bytes:
        """A whole (not streamed) answer in; the bytes to send the client out."""
        f = self.flow
        self._answer_ended = True
        cap = f.capture
        status = f.http_status or 0
        if cap is None:
            return data
        cap.t_first = time.perf_counter()
        if status >= 400:
            cap.chunks.append(data)  # the recorder keeps the error as the upstream sent it
            return data
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            cap.chunks.append(data)
            cap.assembled = Assembled(error="upstream returned a body that is not JSON")
            return data
        try:
            cap.assembled = assemble_obj(obj)  # before stripping: the recorder wants the token fields
        except Exception as e:  # an answer we cannot read is the turn's error, never the client's
            cap.chunks.append(data)
            cap.assembled = Assembled(error=f"cannot read the upstream's answer: {type(e).__name__}: {e}")
        if not self._strip or not strip_obj(obj, self._strip):
            return data
        return orjson.dumps(obj)

    # -- the ends ----------------------------------------------------------------------------------
    def fail(self, status: int, error: str) -> None:
        """The request cannot be answered (refused, bad body, upstream down, a bug of ours)."""
        self._decide(Outcome.ERROR, status, error)

    def upstream_failed(self, error: str) -> None:
        """The upstream failed mid-stream (the client gets the error in-band)."""
        self._decide(Outcome.ERROR, error=error)

    def client_left(self, error: str = "client disconnected") -> None:
        """The client hung up: the outcome if none yet; either way the exchange was aborted."""
        self.flow.client_left = True
        self._decide(Outcome.ABORTED, error=error)

    def end_turn(self) -> Outcome:
        """The answer is over (the read that holds ``[DONE]`` not sent yet): decide the outcome if
        no event has, and tell the addons. Idempotent; the fallback is a bug of ours."""
        f = self.flow
        if f.outcome is None:
            if self._answer_ended or self.done:
                self._settle()
            else:
                self._decide(Outcome.ERROR, error="proxy error: the exchange ended without an outcome")
        assert f.outcome is not None
        return f.outcome

    def close(self, status_sent: int | None) -> None:
        """The exchange is over: the last byte went out, or the client left."""
        self.end_turn()
        self.flow.status_sent = status_sent
        self._addons.call("done", self.flow)

    def _settle(self) -> None:
        """The answer went out whole: ok unless it says it is an error."""
        f = self.flow
        cap = f.capture
        status = f.http_status or 0
        if cap is None:
            self._decide(Outcome.OK if status < 400 else Outcome.ERROR)
            return
        asm = cap.assembled = self._stream.turn() if self._stream is not None else cap.assembled
        cap.done = self.done
        error: str | None = None
        if status >= 400:
            pass  # its error is the upstream's body (``_decide``)
        elif asm is not None and asm.error:
            error = asm.error
        elif cap.stream and asm is not None and asm.bad_events:
            error = f"upstream sent {asm.bad_events} event(s) that are not JSON"
        elif cap.stream and asm is not None and not asm.events:
            error = "upstream stream carried no chunks"
        if status >= 400 or error is not None:
            self._decide(Outcome.ERROR, error=error)
        else:
            self._decide(Outcome.OK)

    def _decide(self, outcome: Outcome, http_status: int | None = None, error: str | None = None) -> None:
        f = self.flow
        if f.outcome is not None:
            return
        f.outcome, f.error = outcome, error
        cap = f.capture
        if cap is not None:
            if self._stream is not None and cap.assembled is None:
                cap.assembled = self._stream.turn()  # whatever happened: the turn the tap saw
                cap.done = self._stream.done
            if cap.http_status is not None and cap.http_status >= 400:
                cap.assembled = None  # an error answer is kept as the upstream's bytes
            if error is None and outcome is not Outcome.OK and cap.chunks:
                error = b"".join(cap.chunks)[:_ERROR_TEXT_BYTES].decode("utf-8", "replace")
            cap.finish(outcome.recorded, http_status, error)
        self._addons.call("outcome", f)
