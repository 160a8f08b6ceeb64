"""Server-sent events: framing, stripping the fields we asked for, reassembling a turn.

``StreamTap`` runs on the hot path, once per upstream read, and does no IO (it is tested alone:
tests/proxy/test_sse.py). For a recorded turn it parses each event once, with orjson, and builds
the turn from it as the stream passes; an event it need not change goes to the client as the
upstream's own bytes. The tap (``tap.py``) builds a whole answer with ``assemble_obj`` from the
parse it strips; ``assemble_stream`` / ``assemble_json`` rebuild a turn from a journal's raw bytes.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


@dataclass(frozen=True)
class Added:
    """Which request fields the proxy added (and must therefore strip from the response)."""

    logprobs: bool = False
    token_ids: bool = False

    def __bool__(self) -> bool:
        return self.logprobs or self.token_ids


def split_events(buf: bytes) -> tuple[list[bytes], bytes]:
    """Split ``buf`` into complete events (each with its terminator) and the unfinished rest."""
    if b"\r" not in buf:  # the common case: LF-only framing, no regex needed
        parts = buf.split(b"\n\n")
        rest = parts.pop()
        return [p + b"\n\n" for p in parts], rest
    events: list[bytes] = []
    start = 0
    for m in _EVENT_END.finditer(buf):
        events.append(buf[start : m.end()])
        start = m.end()
    return events, buf[start:]


def event_data(event: bytes) -> bytes | None:
    """The joined ``data:`` payload of one event, or None if it has none."""
    if event.startswith(b"data: ") and event.count(b"\n") <= 2 and b"\r" not in event:
        return event[6:].rstrip(b"\n")  # one data line: the shape every OpenAI server sends
    parts = []
    for line in event.splitlines():
        if line.startswith(b"data:"):
            v = line[5:]
            parts.append(v[1:] if v.startswith(b" ") else v)
    if not parts:
        return None
    return b"\n".join(parts)


def strip_obj(obj: Any, added: Added) -> bool:
    """Remove the fields we added from one response object (chunk or full body). True if changed."""
    if not isinstance(obj, dict):
        return False
    changed = False
    if added.token_ids and "prompt_token_ids" in obj:
        del obj["prompt_token_ids"]
        changed = True
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if added.token_ids and "token_ids" in choice:
            del choice["token_ids"]
            changed = True
        if added.logprobs and choice.get("logprobs") is not None:
            # OpenAI-shaped servers send "logprobs": null when not asked; keep that shape.
            choice["logprobs"] = None
            changed = True
    return changed


# The first generated token (text, reasoning or a tool call): TTFT starts there, not at the
# role-only first chunk that vLLM and our engine send before prefill.
_GENERATED = re.compile(rb'"(?:content|reasoning_content|reasoning)":\s*"(?!")|"tool_calls":\s*\[')
DONE = b"[DONE]"


class StreamTap:
    """The proxy's view of one upstream event stream, sans IO (mitmproxy's protocol layers): feed
    it each upstream read as it arrives and forward what it returns; ``close`` at the end.

    Bytes pass unchanged unless ``strip`` names fields we added; then whole events are re-framed
    and only those that carry the fields are re-serialized, so at most one unfinished event is
    held back. Along the way it notes the first generated token (``generated``) and the
    ``[DONE]`` event (``done``: an event whose data is ``[DONE]``, never the text in a chunk).
    With ``keep`` it also builds the turn for the recorder from the events it parses once
    (``turn()``; the journal then holds that turn, not the raw stream, which is far cheaper to
    redact), and keeps the upstream's bytes as received (``chunks``) for turns that went wrong.
    """

    __slots__ = ("_rest", "_strip", "_stripping", "_turn", "chunks", "done", "generated")

    def __init__(self, strip: Added = Added(), keep: bool = True):
        self._strip = strip
        self._stripping = bool(strip)
        self._rest = b""
        self._turn = _StreamState() if keep else None
        self.chunks: list[bytes] | None = [] if keep else None
        self.done = False
        self.generated = False

    def feed(self, data: bytes) -> bytes:
        """One upstream read in; the bytes to send the client now out."""
        if self.chunks is not None:
            self.chunks.append(data)
        buf = self._rest + data if self._rest else data
        if b"\r" in buf:  # CR framing: the general path, event by event
            events, self._rest = split_events(buf)
            if not self._stripping:
                for ev in events:
                    self._event(ev)
                return data
            return b"".join([self._event(ev) for ev in events])
        # LF framing, what every OpenAI server sends: one split, and an event of one data line
        # (nearly all) goes to _json without being re-framed first.
        parts = buf.split(b"\n\n")
        self._rest = parts.pop()
        out: list[bytes] = []
        for p in parts:
            if p.startswith(b"data: {") and b"\n" not in p:
                new = self._json(p[6:])
                if new is not None:
                    out.append(new)
                elif self._stripping:
                    out.append(p + b"\n\n")
            else:
                out.append(self._event(p + b"\n\n"))
        if not self._stripping:
            return data
        return out[0] if len(out) == 1 else b"".join(out)

    def close(self) -> bytes:
        """The upstream ended: the unfinished last event, if any (an event may end at EOF)."""
        rest, self._rest = self._rest, b""
        if not rest.strip():
            return rest
        return self._event(rest)

    def turn(self) -> Assembled | None:
        """The turn as the events so far tell it (call once, at the end); None without ``keep``."""
        return self._turn.finish() if self._turn is not None else None

    def _event(self, ev: bytes) -> bytes:
        """One whole event: noted, added to the turn, stripped; the bytes for the client."""
        data = event_data(ev)
        if data is None:
            return ev
        if not self.generated and _GENERATED.search(data):
            self.generated = True
        if not data.startswith(b"{") and data.strip() == DONE:
            self.done = True
            return ev
        new = self._json(data, noted=True)
        return ev if new is None else new

    def _json(self, data: bytes, noted: bool = False) -> bytes | None:
        """One event's data (not ``[DONE]``): added to the turn, stripped; the event re-framed
        if it changed, else None (``noted``: ``generated`` was looked at already)."""
        if not noted and not self.generated and _GENERATED.search(data):
            self.generated = True
        turn, stripping = self._turn, self._stripping
        if turn is None and not (stripping and (b'token_ids"' in data or b'"logprobs"' in data)):
            return None  # prompt_token_ids match too
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if type(obj) is not dict:
            if turn is not None:
                turn.out.bad_events += 1
            return None
        if turn is not None:
            turn.chunk(obj)  # before stripping: the recorder wants the token fields
        if not stripping or not strip_obj(obj, self._strip):
            return None
        return b"data: " + orjson.dumps(obj) + b"\n\n"


# -- reassembly (recorder thread) ----------------------------------------------------------------
_REASONING_KEYS = ("reasoning_content", "reasoning", "reasoning_text")


@dataclass
class Assembled:
    """Everything we keep from one response, streamed or not."""

    response_id: str | None = None
    model: str | None = None
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float | None] | None = None  # None: the upstream gave none for that token
    weight_versions: list[int] = field(default_factory=list)
    error: str | None = None
    events: int = 0
    bad_events: int = 0  # data events that were not a JSON object


def _generated(obj: dict[str, Any]) -> bool:
    """Whether a chunk carries generated output (tokens, text, tool calls, a finish)."""
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("token_ids") or choice.get("finish_reason") is not None:
            return True
        delta = choice.get("delta") or {}
        if isinstance(delta, dict) and any(delta.get(k) for k in ("content", "tool_calls", "refusal", *_REASONING_KEYS)):
            return True
    return False


class _StreamState:
    def __init__(self) -> None:
        self.out = Assembled()
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_key: str | None = None
        self.calls: dict[Any, dict[str, Any]] = {}
        self.order: list[Any] = []
        # Versions on chunks that generated nothing (the opening role chunk, the usage chunk). A
        # request that waited through a pause-keep reload opens under the old version and is
        # generated by the new one: the turn's version is that of its tokens, these are a fallback.
        self.idle_versions: list[int] = []

    def _versions(self, obj: dict[str, Any], into: list[int] | None = None) -> None:
        v = obj.get("weight_version")
        into = self.out.weight_versions if into is None else into
        if isinstance(v, int) and not isinstance(v, bool) and v not in into:
            into.append(v)

    def _call(self, key: Any) -> dict[str, Any]:
        call = self.calls.get(key)
        if call is None:
            call = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            self.calls[key] = call
            self.order.append(key)
        return call

    def envelope(self, obj: dict[str, Any], generated: bool | None = True) -> bool:
        """The fields around the choices (chunk or whole body); False for an error object.
        ``generated`` None: work it out if the chunk's weight version needs it."""
        out = self.out
        if "error" in obj and not obj.get("choices"):
            err = obj["error"]
            out.error = err.get("message") if isinstance(err, dict) else str(err)
            return False
        if not out.response_id:
            out.response_id = obj.get("id")
        if not out.model:
            out.model = obj.get("model")
        v = obj.get("weight_version")
        if v is not None and (v not in self.out.weight_versions or v not in self.idle_versions):
            if generated is None:
                generated = _generated(obj)
            self._versions(obj, None if generated else self.idle_versions)
        if isinstance(obj.get("usage"), dict):
            out.usage = obj["usage"]
        if isinstance(obj.get("prompt_token_ids"), list):
            out.prompt_token_ids = obj["prompt_token_ids"]
        return True

    def chunk(self, obj: dict[str, Any]) -> None:
        out = self.out
        out.events += 1
        if not self.envelope(obj, generated=None):
            return
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # OpenClaw reads choices[0] only; so do we.
            delta = choice.get("delta") or {}
            c = delta.get("content")
            if isinstance(c, str) and (len(delta) == 1 or (len(delta) == 2 and "role" in delta)):
                self.text.append(c)  # most chunks: _delta's first case, without the call
            else:
                self._delta(delta)
            if isinstance(choice.get("usage"), dict):
                out.usage = choice["usage"]
            if choice.get("finish_reason") is not None:
                out.finish_reason = choice["finish_reason"]
            self._tokens(choice)

    def _delta(self, delta: dict[str, Any]) -> None:
        c = delta.get("content")
        if isinstance(c, str) and (len(delta) == 1 or (len(delta) == 2 and "role" in delta)):
            self.text.append(c)  # most chunks: nothing else to look for
            return
        if isinstance(c, str):
            self.text.append(c)
        r = delta.get("refusal")
        if isinstance(r, str):
            self.text.append(r)
        for key in _REASONING_KEYS:
            v = delta.get(key)
            if isinstance(v, str) and (self.reasoning_key in (None, key)):
                self.reasoning_key = key
                self.reasoning.append(v)
        for tc in delta.get("tool_calls") or ():
            if not isinstance(tc, dict):
                continue
            idx: Any = tc.get("index", tc.get("id"))
            if not isinstance(idx, (int, str)) or isinstance(idx, bool):
                idx = repr(idx)  # a list or dict index cannot key the calls
            call = self._call(idx)
            if isinstance(tc.get("id"), str) and tc["id"]:
                call["id"] = tc["id"]
            if isinstance(tc.get("type"), str) and tc["type"]:
                call["type"] = tc["type"]
            fn = tc.get("function")
            if not isinstance(fn, dict):  # malformed ({"function": "x"}): keep what it says
                fn = {"name": fn} if isinstance(fn, str) else {}
            if isinstance(fn.get("name"), str) and fn["name"] and not call["function"]["name"]:
                call["function"]["name"] = fn["name"]
            if isinstance(fn.get("arguments"), str):
                call["function"]["arguments"] += fn["arguments"]
        fc = delta.get("function_call")
        if isinstance(fc, dict):
            call = self._call("function_call")
            if isinstance(fc.get("name"), str) and fc["name"] and not call["function"]["name"]:
                call["function"]["name"] = fc["name"]
            if isinstance(fc.get("arguments"), str):
                call["function"]["arguments"] += fc["arguments"]

    def _tokens(self, choice: dict[str, Any]) -> None:
        out = self.out
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            if out.completion_token_ids is None:
                out.completion_token_ids = []
            out.completion_token_ids.extend(ids)
        lp = choice.get("logprobs")
        if isinstance(lp, dict) and isinstance(content := lp.get("content"), list):
            lps = out.completion_logprobs
            if lps is None:
                lps = out.completion_logprobs = []
            if len(content) == 1:  # a streamed chunk's one token: no generator to build
                if isinstance(e := content[0], dict):
                    lps.append(e.get("logprob"))
            else:
                lps.extend([e.get("logprob") for e in content if isinstance(e, dict)])

    def finish(self) -> Assembled:
        out = self.out
        if not out.weight_versions:
            out.weight_versions = list(self.idle_versions)
        out.text = "".join(self.text)
        out.reasoning = "".join(self.reasoning)
        out.tool_calls = [self.calls[k] for k in self.order]
        return out


def assemble_stream(raw: bytes) -> Assembled:
    """Rebuild one turn from the raw SSE bytes the upstream sent (as received, unstripped); the
    recorder's way for a turn the tap did not build (one replayed from an older journal)."""
    events, rest = split_events(raw)
    if rest.strip():
        events.append(rest)
    tap = StreamTap()
    for i, ev in enumerate(events):
        if i % 16 == 15:
            # Runs in the recorder thread: hand the GIL to the event loop often, or every chunk
            # the proxy forwards meanwhile waits for the interpreter's 5 ms switch interval.
            time.sleep(0)
        tap._event(ev)
    turn = tap.turn()
    assert turn is not None
    return turn


def assemble_json(raw: bytes) -> Assembled:
    """Rebuild one turn from a non-streamed chat completion body."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return Assembled(error="upstream returned a body that is not JSON")
    return assemble_obj(obj)


def assemble_obj(obj: Any) -> Assembled:
    """One turn from a non-streamed chat completion, parsed."""
    state = _StreamState()
    out = state.out
    if not isinstance(obj, dict):
        return state.finish()
    if not state.envelope(obj):
        return state.finish()
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        msg = dict(choice.get("message") or {})
        # A full message has the same fields as a delta; tool calls come whole, keyed by position.
        calls = msg.pop("tool_calls", None) or []
        state._delta(msg)
        for i, tc in enumerate(calls):
            if isinstance(tc, dict):
                state._delta({"tool_calls": [{"index": i, **tc}]})
        out.finish_reason = choice.get("finish_reason")
        state._tokens(choice)
    return state.finish()
