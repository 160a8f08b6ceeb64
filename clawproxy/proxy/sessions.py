"""Session identity, turn classification and next-state linking (docs/openclaw-wire.md §2).

All of this runs in the recorder's single worker thread, so the tracker's in-memory state needs no
locks. Pure functions (``identify``, ``classify``, ``next_state_after``) are
kept separate from ``SessionTracker``, which owns state and writes to the store.

What OpenClaw does that matching must tolerate: every call ends with a transient
``<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>`` user message that is never replayed; replayed assistant
turns have tool-call ids reduced to [A-Za-z0-9], arguments re-serialized and ``<think>`` stripped.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from clawproxy.openclaw import is_ctx, message_text, strip_ctx
from clawproxy.store import WAITING, Link, Store, TurnState, recorded_state

log = logging.getLogger("clawproxy.sessions")

_RUNTIME_RE = re.compile(r"Runtime:[^\n]*?\bsessionId=([^\s|]+)")
_RUNTIME_SESSION_RE = re.compile(r"Runtime:[^\n]*?\bsession=([^\s|]+)")
_RUNTIME_AGENT_RE = re.compile(r"Runtime:\s*agent=([^\s|]+)")
_THINK_RE = re.compile(r"<(think|thinking|thought|reasoning)>.*?</\1>\s*", re.S)
_WS_RE = re.compile(r"\s+")
_NON_ALNUM = re.compile(r"[^A-Za-z0-9]")
# Re-rendered timestamps differ between an original request and OpenClaw's retry of it ("23:01"
# vs "23:02"). Masking ":MM" / ":SS" is enough and, with a literal first character, ~100x faster
# than a full date-time pattern over a 50 KB body (this runs in the recorder, holding the GIL).
_TIME_RE = re.compile(r":\d\d(?:\.\d+)?")


# -- message helpers (shared OpenClaw wire helpers live in clawproxy.openclaw) --------------------


def _canon_args(args: Any) -> str:
    if isinstance(args, str):
        try:
            return orjson.dumps(orjson.loads(args), option=orjson.OPT_SORT_KEYS).decode()
        except orjson.JSONDecodeError:
            return args.strip()
    return orjson.dumps(args, option=orjson.OPT_SORT_KEYS).decode()


def normalize_message(msg: Any) -> tuple:
    """A comparison key for a message that survives OpenClaw's re-rendering of history."""
    if not isinstance(msg, dict):
        return ("?", str(msg))
    role = msg.get("role", "")
    text = _WS_RE.sub(" ", _THINK_RE.sub("", message_text(msg))).strip()
    tool_calls = msg.get("tool_calls")
    calls = tuple(
        (str(fn.get("name", "")), _canon_args(fn.get("arguments", "")))
        if isinstance(fn := tc.get("function"), dict) else ("?", repr(fn))
        for tc in (tool_calls if isinstance(tool_calls, list) else ())
        if isinstance(tc, dict)
    )
    tcid = _NON_ALNUM.sub("", str(msg.get("tool_call_id") or ""))
    return (role, text, calls, tcid)


# OpenClaw re-sends the same ~40 KB system prompt and history every call; normalizing it (regex
# passes over every message) is most of the tracker's cost, so digests of long texts are cached.
_DIGESTS: OrderedDict[tuple[str, str], bytes] = OrderedDict()
_DIGEST_CACHE_SIZE = 512
_DIGEST_LOCK = threading.Lock()  # several apps (tests) may share the process


def message_digest(m: Any) -> bytes:
    """Digest of ``normalize_message(m)``."""
    key = None
    if (isinstance(m, dict) and isinstance(m.get("content"), str) and len(m) == 2
            and isinstance(m.get("role"), str)):
        key = (m["role"], m["content"])
        with _DIGEST_LOCK:
            d = _DIGESTS.get(key)
            if d is not None:
                _DIGESTS.move_to_end(key)
                return d
    d = hashlib.blake2b(orjson.dumps(normalize_message(m)), digest_size=16).digest()
    if key is not None and len(key[1]) > 256:
        with _DIGEST_LOCK:
            _DIGESTS[key] = d
            if len(_DIGESTS) > _DIGEST_CACHE_SIZE:
                _DIGESTS.popitem(last=False)
    return d


def prefix_hashes(messages: list[Any]) -> list[bytes]:
    """h[k] identifies the normalized ``messages[:k]`` (h[0] is the empty prefix)."""
    h = hashlib.blake2b(digest_size=16).digest()
    out = [h]
    for m in messages:
        h = hashlib.blake2b(h + message_digest(m), digest_size=16).digest()
        out.append(h)
    return out


def body_hash(body: dict[str, Any]) -> str:
    """Hash of a request body with re-rendered timestamps masked (retry detection)."""
    raw = orjson.dumps(body, option=orjson.OPT_SORT_KEYS).decode()
    return hashlib.sha256(_TIME_RE.sub("T", raw).encode()).hexdigest()


# -- identity ------------------------------------------------------------------------------------
@dataclass
class Identity:
    session_id: str | None
    source: str | None
    compaction: int | None = None
    session_key: str | None = None
    agent: str | None = None


def split_compaction(value: str) -> tuple[str, int | None]:
    """``<sessionId>:<compactionCount>`` -> (sessionId, count); a bare id -> (id, None)."""
    head, sep, tail = value.rpartition(":")
    if sep and head and tail.isdigit():
        return head, int(tail)
    return value, None


def identify(headers: dict[str, str], body: dict[str, Any]) -> Identity:
    """Session identity from explicit signals, in order of trust (docs/openclaw-wire.md §2.4):
    affinity header, prompt_cache_key, x-session-id, the Runtime line. Prefix chaining is separate."""
    messages = body.get("messages") or []
    first_user = next(
        (m for m in messages if isinstance(m, dict) and m.get("role") == "user"), None
    )
    runtime = message_text(first_user) if first_user else ""
    key = agent = None
    if "Runtime:" in runtime:
        if m := _RUNTIME_SESSION_RE.search(runtime):
            key = m.group(1)
        if m := _RUNTIME_AGENT_RE.search(runtime):
            agent = m.group(1)
    candidates: list[tuple[str | None, str]] = [
        (headers.get("session_id") or headers.get("x-session-affinity"), "header"),
        (body.get("prompt_cache_key") if isinstance(body.get("prompt_cache_key"), str) else None,
         "prompt_cache_key"),
        (headers.get("x-session-id"), "x-session-id"),
    ]
    if m := _RUNTIME_RE.search(runtime):
        candidates.append((m.group(1), "runtime"))
    for value, source in candidates:
        if value and value.strip():
            sid, comp = split_compaction(value.strip())
            return Identity(sid, source, comp, key, agent)
    return Identity(None, None, None, key, agent)


# -- classification ------------------------------------------------------------------------------
def classify(body: dict[str, Any], stream: bool) -> str | None:
    """What a side request is for (its side_kind column, docs/openclaw-wire.md §2.7), or None for a main turn.

    Unknown requests are main: defaulting to side would silently never train on them.
    """
    messages = [m for m in (body.get("messages") or []) if isinstance(m, dict)]
    system = next((message_text(m) for m in messages if m.get("role") in ("system", "developer")), "")
    sys_head = system.lstrip()[:200]
    if sys_head.startswith("You are a context summarization assistant"):
        return "compaction"
    if sys_head.startswith("Generate a concise session title"):
        return "title"
    if sys_head.startswith("You are a memory search agent"):
        return "recall"
    real_users = [m for m in strip_ctx(messages) if m.get("role") == "user" and not is_ctx(m)]
    last_user = message_text(real_users[-1]).lstrip() if real_users else ""
    if "Pre-compaction memory flush turn." in system or last_user.startswith(
        "Pre-compaction memory flush."
    ):
        return "memory_flush"
    if is_heartbeat_prompt(last_user):
        return "heartbeat"
    if (
        not stream
        and len(messages) == 1
        and messages[0].get("role") == "user"
        and message_text(messages[0]).strip() == "Hi"
        and (body.get("max_tokens") or body.get("max_completion_tokens")) == 16
    ):
        return "probe"
    return None


def is_heartbeat_prompt(text: str) -> bool:
    """OpenClaw's heartbeat poll (docs/openclaw-wire.md §2.7), not something the user said."""
    t = text.lstrip()
    return t.startswith("Follow the heartbeat monitor") or "[OpenClaw heartbeat poll]" in t


def next_state_after(
    messages: list[Any], prompt_len: int | None, prompt_hash: bytes | None,
    hashes: list[bytes] | None = None,
) -> list[dict[str, Any]] | None:
    """The messages that followed the assistant turn answering a ``prompt_len``-message prompt.

    Exact path: the new request's first ``prompt_len`` messages are the old prompt (normalized),
    followed by the replayed assistant message. Fallback (history rewritten, e.g. compaction):
    whatever follows the last assistant message. Stops at the next assistant message; drops CTX.
    """
    msgs = strip_ctx(messages)
    start: int | None = None
    if (
        prompt_len is not None
        and prompt_hash is not None
        and len(msgs) > prompt_len + 1
        and isinstance(msgs[prompt_len], dict)
        and msgs[prompt_len].get("role") == "assistant"
        and (hashes[prompt_len] if hashes is not None and len(hashes) > prompt_len
             else prefix_hashes(msgs[:prompt_len])[-1]) == prompt_hash
    ):
        start = prompt_len + 1
    else:
        for i in range(len(msgs) - 1, -1, -1):
            if isinstance(msgs[i], dict) and msgs[i].get("role") == "assistant":
                start = i + 1
                break
    if start is None:
        return None
    out: list[dict[str, Any]] = []
    skip_reply = False
    for m in msgs[start:]:
        if not isinstance(m, dict):
            break
        if m.get("role") == "assistant":
            if skip_reply:  # the heartbeat's own answer (NO_REPLY), not a turn of this exchange
                skip_reply = False
                continue
            break
        if m.get("role") == "user" and is_heartbeat_prompt(message_text(m)):
            skip_reply = True
            continue
        if not is_ctx(m):
            out.append(m)
    return out or None


# -- the tracker ---------------------------------------------------------------------------------
def _own(user: str | None, key: Any) -> Any:
    """A prefix or body key within ``user``'s turns: content never links turns of two users."""
    return key if user is None else (user, key)


@dataclass
class _Pending:
    """The session's newest main turn, which the next main request may carry the next state of."""

    turn_id: int
    prompt_len: int
    prompt_hash: bytes
    state: TurnState


class _Seen(NamedTuple):
    """A request body the retry memory knows: the turn that carried it."""

    turn_id: int
    created_at: float
    status: str
    session_id: str | None


@dataclass
class _SessionState:
    next_index: int
    pending: _Pending | None


_STATES = frozenset(TurnState)  # a row written outside the recorder may hold anything


class SessionTracker:
    """Turns parsed records into rows: session upsert, turn insert, next-state link of the previous.

    State kept in memory is a cache of what the store holds: per-session state is rebuilt lazily,
    and the prefix index (chaining requests that carry no identity) and the retry memory are
    seeded from the store on the first record, so a restarted proxy still links the next request
    of an open conversation to its last answer and still knows a retry sent across the restart.
    """

    def __init__(self, retry_window_s: float, idle_timeout_s: float, index_size: int = 5000):
        self.retry_window_s = retry_window_s
        self.idle_timeout_s = idle_timeout_s
        self._sessions: dict[str, _SessionState] = {}
        self._prefix_index: OrderedDict[bytes, str] = OrderedDict()
        self._recent: OrderedDict[str, _Seen] = OrderedDict()
        self._index_size = index_size
        self._warm = False

    def warm(self, store: Store, now: float | None = None) -> None:
        """Seed the prefix index with the last answered prompt of every open session and the retry
        memory with the bodies recorded within the retry window (what a restart forgot)."""
        self._warm = True
        now = now if now is not None else time.time()
        rows = store.open_session_prompts(now - self.idle_timeout_s, self._index_size)
        for sid, user, messages in reversed(rows):
            prompt = strip_ctx(messages or [])
            if prompt:
                self._remember(self._prefix_index, _own(user, prefix_hashes(prompt)[-1]), sid)
        recent = store.recent_bodies(now - self.retry_window_s, self._index_size)
        for r in reversed(recent):
            self._remember(self._recent, _own(r["user"], r["body_hash"]),
                           _Seen(r["id"], r["created_at"], r["status"], r["session_id"]))
        if rows or recent:
            log.info("session index seeded from the store: %d open session(s), %d recent body(ies)",
                     len(rows), len(recent))

    def forget(self) -> None:
        """Drop cached state (after a store failure the cache may be ahead of the store); the retry
        memory is seeded again from the store on the next record."""
        self._sessions.clear()
        self._recent.clear()
        self._warm = False

    def _state(self, store: Store, sid: str, retried: int | None = None) -> _SessionState:
        """The session's state, read from the store on a cache miss. ``retried``: a failed turn
        this record turns into a retry, so it is no longer the session's newest main turn."""
        st = self._sessions.get(sid)
        if st is not None:
            return st
        next_index, last = store.session_tail(sid, skip=retried)
        pending = None
        # Only the newest main turn can wait for a next state: an answered, failed or finalized
        # one means the conversation moved on without it.
        state = TurnState(last["reason"]) if last and last["reason"] in _STATES else None
        if last and last["status"] == "ok" and not last["answered"] and state not in (None, TurnState.NO_NEXT_STATE):
            prompt = strip_ctx(last["request_messages"] or [])
            pending = _Pending(last["id"], len(prompt), prefix_hashes(prompt)[-1], state)
        st = _SessionState(next_index, pending)
        self._sessions[sid] = st
        return st

    def _remember(self, d: OrderedDict, key: Any, value: Any) -> None:
        d[key] = value
        d.move_to_end(key)
        while len(d) > self._index_size:
            d.popitem(last=False)

    def ingest(self, store: Store, rec: dict[str, Any]) -> int | None:
        """Write one parsed turn record in one transaction (its session, the turn, the link of the
        previous turn); returns the turn id (None if it was already stored)."""
        if store.has_turn(rec["request_id"]):
            return None
        return self._ingest(store, rec)

    def _ingest(self, store: Store, rec: dict[str, Any]) -> int | None:
        if not self._warm:
            self.warm(store, rec["created_at"])
        body = rec.get("request_body") or {}
        messages = raw if isinstance(raw := body.get("messages"), list) else []
        now = rec["created_at"]
        ident = identify(rec.get("session_headers") or {}, body) if body else Identity(None, None)
        user = rec.get("user")
        side_purpose = classify(body, bool(rec.get("stream"))) if messages else None
        turn_type = "side" if side_purpose else "main"

        prompt = strip_ctx(messages)
        hashes = prefix_hashes(prompt) if messages else []
        sid, source = ident.session_id, ident.source
        if sid is not None and user is not None:
            sid = f"{user}/{sid}"  # two users' OpenClaw "main" sessions are two sessions
        if sid is None and messages:
            # Prefix chaining: an earlier prompt + its assistant reply begin this request.
            for k in range(len(prompt) - 1, 0, -1):
                if isinstance(prompt[k], dict) and prompt[k].get("role") == "assistant":
                    hit = self._prefix_index.get(_own(user, hashes[k]))
                    if hit:
                        sid, source = hit, "prefix"
                        break

        # Retries: an identical body within the window keeps only one trainable copy. Known
        # bodies live in memory (bounded), seeded from the store after a restart.
        bh = rec.get("body_hash")
        retry_of = None
        seen = self._recent.get(_own(user, bh)) if bh and messages else None
        # Same body from another session (two users both saying "hi") is not a retry.
        if seen and now - seen.created_at <= self.retry_window_s and sid in (None, seen.session_id):
            retry_of = seen
            if sid is None and seen.session_id is not None:
                sid, source = seen.session_id, "retry"
        if sid is None and messages and turn_type == "main":
            sid, source = f"{user + '/' if user else ''}anon-{uuid.uuid4().hex[:12]}", "new"
        retried = None
        if retry_of and retry_of.status == "ok":
            turn_type = "retry"
        elif retry_of:
            # The earlier copy failed: it becomes the retry, this one is the turn we keep.
            retried = retry_of.turn_id

        state = recorded_state(rec, turn_type)
        row = {k: rec.get(k) for k in _TURN_FIELDS}
        row["user"] = user
        row.update(
            session_id=sid, kind=turn_type, side_kind=side_purpose, compaction=ident.compaction, reason=state,
            request_messages=messages or None,
            request_tools=body.get("tools"),
            request_params={k: v for k, v in body.items() if k not in ("messages", "tools")} or None,
        )
        st = session = previous = None
        if sid is not None:
            # Only active (non-side) turns restart the idle clock: OpenClaw's heartbeat runs in the
            # main session and would otherwise keep its last main turn waiting forever.
            session = {"id": sid, "source": source or "new", "session_key": ident.session_key,
                       "agent": ident.agent, "compaction": ident.compaction, "seen_at": now,
                       "active": side_purpose is None, "user": user}
            st = self._state(store, sid, retried)
            row["turn_index"] = st.next_index
            st.next_index += 1
            if turn_type == "main" and messages:
                previous = self._link(st, messages, hashes)
        # Everything above only read; the writes go in one transaction. On failure the caller
        # forgets the cached state, which is then ahead of the store.
        turn_id = store.record_turn(row, session=session, retried=retried, previous=previous)
        if turn_id is None:  # another writer stored this request meanwhile
            self.forget()
            return None
        if bh and messages and turn_type != "retry":
            self._remember(self._recent, _own(user, bh), _Seen(turn_id, now, rec["status"], sid))
        if st is not None and turn_type == "main" and messages and rec["status"] == "ok":
            st.pending = _Pending(turn_id, len(prompt), hashes[-1], state)
            self._remember(self._prefix_index, _own(user, hashes[-1]), sid)
        return turn_id

    def _link(self, st: _SessionState, messages: list[Any], hashes: list[bytes]) -> Link | None:
        """What this main request says of the session's previous main turn: its next state, and
        the move of a waiting turn to ``ok`` (next state found) or ``no_next_state`` (none)."""
        p = st.pending
        if p is None:
            return None
        st.pending = None
        waiting = p.state in WAITING
        ns = next_state_after(messages, p.prompt_len, p.prompt_hash, hashes)
        if ns is None:
            return Link(p.turn_id, TurnState.NO_NEXT_STATE) if waiting else None
        # A cut-off answer is judged like any other: the user reacted to what was cut off; the
        # trainer decides what it trains (trainer/batch.py). One that is final keeps its next
        # state for the record only.
        role = "tool" if ns[0].get("role") == "tool" else "user"
        return Link(p.turn_id, TurnState.OK if waiting else None, ns, role)

    def finalize_idle(self, store: Store, now: float | None = None) -> int:
        """Sessions idle past the timeout: their pending last turn gets no next state."""
        ids = store.finalize_idle_sessions((now if now is not None else time.time()) - self.idle_timeout_s)
        for sid in ids:
            self._sessions.pop(sid, None)
        if ids:
            log.info("finalized %d idle session(s)", len(ids))
        return len(ids)


_TURN_FIELDS = (
    "request_id", "created_at", "path", "status", "http_status", "error", "model", "stream",
    "body_hash", "response_text", "response_reasoning", "response_tool_calls", "finish_reason",
    "usage", "prompt_token_ids", "completion_token_ids", "completion_logprobs", "weight_version",
    "weight_versions", "ttft_ms", "total_ms", "instruction", "instruction_id", "applied_ids", "instruction_role",
)
