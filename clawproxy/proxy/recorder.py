"""The recorder: takes captured turns off the request path and writes them to the store.

The request path only appends raw bytes to a ``Capture`` and hands it over with ``submit``, which
first appends the raw turn to ``<data_dir>/journal.bin`` (one ``write``, no fsync: it survives a
SIGKILL of the proxy, not a power cut) and then puts it on a bounded queue. The proxy calls
``submit`` before it forwards a stream's ``[DONE]``, so a turn the client saw finish is on disk. An
owned task drains the queue in batches and runs all the expensive work (SSE reassembly, redaction,
session tracking, SQLite writes) in one worker thread; once the queue is empty after a batch,
everything journaled is stored and the journal is truncated. At start, the journal is replayed
(ingest is idempotent by request_id), so turns a kill caught between journal and store are kept.

Failures are kept apart:
- the store fails (full disk, I/O error, locked, cannot open): the record goes to
  ``spool.jsonl`` (fsynced), replayed at the next start and as soon as a write succeeds again;
  if the spool cannot be written either, the turn is counted as lost (health and stats show it);
- one record cannot be stored (a field of a type no column takes, nesting too deep for the
  serializer, a bug of ours): it goes alone to the ``quarantine`` table (or
  ``quarantine.jsonl`` while the store is down) with the reason, never blocking the others.
Secret-looking strings are redacted before a record reaches the store, spool or quarantine.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from clawproxy.config import Config
from clawproxy.errors import StoreError
from clawproxy.proxy.redact import Redactor
from clawproxy.proxy.sessions import SessionTracker, body_hash
from clawproxy.proxy.sse import Assembled, assemble_json, assemble_stream
from clawproxy.store import Store

log = logging.getLogger("clawproxy.recorder")
# SQLite errors that say the record itself is wrong; every other sqlite3.Error is the store.
RECORD_SQL_ERRORS = (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.ProgrammingError,
                     sqlite3.DataError)
JOURNAL_MAGIC = b"CJ1 "
QUIET_WAIT_S = 1.0  # the longest a turn waits to be stored while requests keep the loop busy
# Text columns a client or upstream can fill with any JSON value: stored as text whatever came.
_TEXT_FIELDS = ("model", "finish_reason", "error", "response_text", "response_reasoning")
_TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "completion_logprobs")


def is_store_failure(e: BaseException) -> bool:
    """A failure of the store (retry later: spool) rather than of this one record (quarantine)."""
    if isinstance(e, sqlite3.Error):
        return not isinstance(e, RECORD_SQL_ERRORS)
    return isinstance(e, (StoreError, OSError))


@dataclass(slots=True)
class Capture:
    """What the request path saw of one chat-completions call. Filled cheaply, parsed later."""

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
    assembled: Assembled | None = None  # the streamed turn, as the proxy's tap built it
    header_weight_version: int | None = None
    t_first: float | None = None
    t_end: float | None = None
    redacted: bool = False  # the journal already redacted this turn (its token ids must go)
    user: str | None = None  # who asked (clawproxy/users.py); None: a proxy with no users
    routed_version: int | None = None  # the weight version the router sent it to (None: not routed)

    def finish(self, status: str, http_status: int | None = None, error: str | None = None) -> bool:
        """End the turn as ``status`` ("ok", "error", "aborted"); the first call wins, later ones
        (a fallback in a ``finally``) change nothing. True if this call ended it."""
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


def parse_capture(cap: Capture, redactor: Redactor | None = None) -> dict[str, Any]:
    """Turn a capture into a plain, JSON-serializable record (also the spool format).

    Raises (TypeError, ValueError, orjson.JSONEncodeError...) when the turn cannot be represented;
    the recorder quarantines it with the reason.
    """
    raw = b"".join(cap.chunks)
    asm = None
    if cap.http_status is not None and cap.http_status < 400:
        if cap.assembled is not None:
            asm = cap.assembled
        elif raw:
            asm = assemble_stream(raw) if cap.stream else assemble_json(raw)
    status, error = cap.status, cap.error
    if asm is not None and asm.error and status == "ok":
        status, error = "error", asm.error
    if cap.http_status is not None and cap.http_status >= 400 and status == "ok":
        status = "error"
    if cap.stream and status == "ok" and cap.http_status is not None and cap.http_status < 400:
        if not cap.done:
            status, error = "error", "upstream closed the stream before [DONE]"
        elif asm is not None and asm.bad_events:
            status, error = "error", f"upstream sent {asm.bad_events} event(s) that are not JSON"
        elif asm is not None and not asm.events:
            status, error = "error", "upstream stream carried no chunks"
    if error is None and status == "error" and raw:
        error = raw[:2000].decode("utf-8", "replace")
    body = cap.body or {}
    rec: dict[str, Any] = {
        "request_id": cap.request_id,
        "created_at": cap.created_at,
        "path": cap.path,
        "status": status,
        "http_status": cap.http_status,
        "error": error,
        "model": (asm.model if asm and asm.model else None) or body.get("model"),
        "stream": int(bool(body.get("stream"))),
        "request_body": cap.body,
        "session_headers": {k: clean_header(v) for k, v in cap.session_headers.items()},
        "ttft_ms": (cap.t_first - cap.t0) * 1000 if cap.t_first else None,
        "total_ms": ((cap.t_end or time.perf_counter()) - cap.t0) * 1000,
        "header_weight_version": cap.header_weight_version,
        "routed_weight_version": cap.routed_version,
        "user": cap.user,
    }
    if asm is not None:
        rec.update(
            response_text=asm.text or None,
            response_reasoning=asm.reasoning or None,
            response_tool_calls=asm.tool_calls or None,
            finish_reason=asm.finish_reason,
            usage=asm.usage,
            prompt_token_ids=asm.prompt_token_ids,
            completion_token_ids=asm.completion_token_ids,
            completion_logprobs=asm.completion_logprobs,
            weight_versions=asm.weight_versions or None,
            weight_version=asm.weight_versions[0] if asm.weight_versions else None,
        )
    for k in _TEXT_FIELDS:
        v = rec.get(k)
        if v is not None and not isinstance(v, str):
            rec[k] = orjson.dumps(v).decode()
    # One serialization checks that everything can be stored, and carries the redaction.
    if redactor is not None:
        # The upstream's token fields stay out of it: log-probs name each sampled piece "token".
        tokens = {k: rec.pop(k) for k in _TOKEN_FIELDS if k in rec}
        body = rec.pop("request_body")
        rec, changed = redactor.tree(rec)
        data = orjson.dumps(rec)
        clean = redactor.bytes(data)
        if body is not None:
            clean_body, body_changed = redact_body(redactor, body, None)
            changed |= body_changed
        if changed or clean != data or cap.redacted:
            # Token ids spell the secret out again; without them the trainer skips the turn.
            tokens = dict.fromkeys(tokens)
        rec = orjson.loads(clean)
        rec["request_body"] = orjson.loads(clean_body) if body is not None else None
        rec.update(tokens)
        orjson.dumps(tokens)  # they must be storable too
    else:
        rec = orjson.loads(orjson.dumps(rec))
    rec["body_hash"] = body_hash(rec["request_body"]) if rec["request_body"] else None
    return rec


def redact_body(redactor: Redactor, body: dict[str, Any] | None, raw: bytes | None) -> tuple[bytes, bool]:
    """A request body, serialized with its secrets redacted; (the bytes, whether any were found).

    Member by member and message by message, each cached: OpenClaw sends the whole conversation
    again every turn, so a turn pays for its new messages only. The result is ``body``
    re-serialized, never ``raw`` (the client's bytes), which may hold what the parse dropped (a
    duplicate key). A body orjson cannot serialize (nested too deep) is redacted whole, from
    ``raw`` when nothing needed redacting, as before; serializing it then raises where it must.
    """
    if body is not None:
        try:
            parts, changed = [], False
            for k, v in body.items():
                if k == "messages" and isinstance(v, list):
                    items = [_redacted_json(redactor, orjson.dumps(m)) for m in v]
                    changed |= any(c for _, c in items)
                    parts.append(b'"messages":[' + b",".join([d for d, _ in items]) + b"]")
                else:
                    d, c = _redacted_json(redactor, orjson.dumps({k: v}))
                    changed |= c
                    parts.append(d[1:-1])  # '"k":v' out of '{"k":v}'
            return b"{" + b",".join(parts) + b"}", changed
        except (orjson.JSONEncodeError, TypeError):
            pass
    tree, changed = redactor.tree(body) if body is not None else (None, False)
    data = orjson.dumps(tree) if changed or raw is None else raw
    clean = redactor.bytes(data)
    return clean, changed or clean != data


@functools.lru_cache(maxsize=512)
def _redacted_json(redactor: Redactor, data: bytes) -> tuple[bytes, bool]:
    """One serialized JSON value with its secrets redacted (by structure, then by format)."""
    tree, changed = redactor.tree(orjson.loads(data))
    out = orjson.dumps(tree) if changed else data
    clean = redactor.bytes(out)
    return clean, changed or clean != data


def raw_turn_text(cap: Capture, redactor: Redactor | None) -> str:
    """What a quarantined turn keeps when it has no record: its raw request and response."""
    data = b"request: " + cap.raw_body + b"\nresponse: " + b"".join(cap.chunks)
    if redactor is not None:
        data = redactor.bytes(data)
    return data.decode("utf-8", "replace")


# -- the journal: turns, appended before the client's last byte -----------------------------------
def journal_entry(cap: Capture, redactor: Redactor | None = None) -> bytes:
    """One journal record: meta line, request body, response; with ``redactor``, the body and the
    response are redacted first (by structure and by format), so no secret reaches the disk.

    A 2xx stream is journaled as the turn the tap built (a few hundred bytes of text to redact,
    where the raw stream is tens of KB of envelopes); any other response as the upstream's bytes,
    which the recorder may need for the error. Token ids and log-probs stay out of the redaction, as in ``parse_capture``.
    """
    body = cap.raw_body
    redacted = False
    if redactor is not None:
        body, redacted = redact_body(redactor, cap.body, cap.raw_body)
    asm = cap.assembled if cap.http_status is not None and cap.http_status < 400 else None
    if asm is not None:
        turn = {f.name: getattr(asm, f.name) for f in fields(asm)}
        tokens = {k: turn.pop(k) for k in _TOKEN_FIELDS}
        data = orjson.dumps(turn)
        if redactor is not None:
            tree, changed = redactor.tree(turn)
            clean = redactor.bytes(orjson.dumps(tree) if changed else data)
            redacted |= clean != data
            data = clean
        resp = b'{"tokens":' + orjson.dumps(tokens) + b',"turn":' + data + b"}"
    else:
        resp = b"".join(cap.chunks)
        if redactor is not None:
            clean = redactor.bytes(resp, stream=True)
            redacted |= clean != resp
            resp = clean
    meta = orjson.dumps({
        "id": cap.request_id, "at": cap.created_at, "path": cap.path, "stream": cap.stream,
        "done": cap.done, "http": cap.http_status, "status": cap.status, "error": cap.error,
        "h": {k: clean_header(v) for k, v in cap.session_headers.items()},
        "wv": cap.header_weight_version, "u": cap.user, "rv": cap.routed_version,
        "ttft": cap.t_first - cap.t0 if cap.t_first else None,
        "total": (cap.t_end or time.perf_counter()) - cap.t0,
        "nb": len(body), "nr": len(resp), "red": redacted or cap.redacted, "asm": asm is not None,
    })
    return b"".join((JOURNAL_MAGIC, meta, b"\n", body, resp))


def read_journal(path: Path) -> list[Capture]:
    """The complete entries of a journal file; a torn last entry (killed mid-write) is skipped."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out, pos = [], 0
    while pos < len(data):
        if not data.startswith(JOURNAL_MAGIC, pos):
            log.error("journal %s: unreadable from byte %d; the rest is skipped", path, pos)
            break
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        try:
            m = orjson.loads(data[pos + len(JOURNAL_MAGIC) : nl])
        except orjson.JSONDecodeError:
            break
        end = nl + 1 + m["nb"] + m["nr"]
        if end > len(data):
            break  # torn: the client never got this turn's last byte
        raw_body = data[nl + 1 : nl + 1 + m["nb"]]
        try:
            body = orjson.loads(raw_body) if raw_body else None
        except orjson.JSONDecodeError:
            body = None
        cap = Capture(m["id"], m["at"], m["path"], 0.0, body=body if isinstance(body, dict) else None,
                      raw_body=raw_body, session_headers=m["h"], stream=m["stream"],
                      done=m["done"], http_status=m["http"], status=m["status"], error=m["error"],
                      header_weight_version=m["wv"], t_first=m["ttft"], t_end=m["total"],
                      redacted=m.get("red", False), user=m.get("u"), routed_version=m.get("rv"))
        resp = data[nl + 1 + m["nb"] : end]
        if m.get("asm"):
            rec = orjson.loads(resp)
            cap.assembled = Assembled(**rec["turn"], **rec["tokens"])
        else:
            cap.chunks.append(resp)
        out.append(cap)
        pos = end
    return out


class Recorder:
    """Journal + bounded queue + owned drain task + single worker thread + spool + quarantine."""

    def __init__(self, cfg: Config, *, reopen_interval_s: float = 2.0, finalize_interval_s: float | None = None,
                 busy: Callable[[], bool] | None = None):
        self.cfg = cfg
        self.busy = busy  # whether requests are in flight: the worker then waits (QUIET_WAIT_S)
        self.data_dir = cfg.data_path
        self.spool_path = self.data_dir / "spool.jsonl"
        self.journal_path = self.data_dir / "journal.bin"
        self.quarantine_path = self.data_dir / "quarantine.jsonl"
        self.redactor = Redactor(cfg.proxy.redact_patterns) if cfg.proxy.redact_secrets else None
        self.queue: asyncio.Queue[Capture] = asyncio.Queue(maxsize=cfg.proxy.recorder_queue_size)
        self.tracker = SessionTracker(cfg.sessions.retry_window_s, cfg.sessions.idle_timeout_s)
        self.reopen_interval_s = reopen_interval_s
        self.finalize_interval_s = finalize_interval_s or min(60.0, cfg.sessions.idle_timeout_s / 4)
        self.store: Store | None = None
        self.store_ok = False
        self.recorded = 0
        self.spooled = 0
        self.quarantined = 0
        self.lost = 0  # neither stored, spooled nor quarantined (store and disk both failed)
        self.overflow = 0  # queue full: kept only in the journal until the queue drains
        self._overflowed: set[str] = set()  # their request ids, replayed from the journal
        self.last_error: str | None = None
        self.last_loss: str | None = None  # why the last lost turn could not even be spooled
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clawproxy-recorder")
        self._tasks: list[asyncio.Task] = []
        self._last_open_try = 0.0
        self._journal_fd: int | None = None
        self._journal_bytes = 0
        self._journal_failed = False

    # -- lifecycle (event loop) ------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._startup)
        self._tasks = [
            asyncio.create_task(self._drain(), name="clawproxy-recorder"),
            asyncio.create_task(self._finalize_loop(), name="clawproxy-session-finalizer"),
        ]

    async def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (bounded wait), stop the tasks, close the store."""
        try:
            await asyncio.wait_for(self.queue.join(), timeout)
        except TimeoutError:
            log.error("recorder: the store is slow; %d record(s) still queued at shutdown go to %s",
                      self.queue.qsize(), self.spool_path)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        left = []
        while not self.queue.empty():
            left.append(self.queue.get_nowait())
            self.queue.task_done()
        loop = asyncio.get_running_loop()
        if left:  # replayed at the next start
            await loop.run_in_executor(self._executor, self._spool_captures, left)
        if not self._overflowed:  # else the next start replays them
            self._truncate_journal()
        await loop.run_in_executor(self._executor, self._close_store)
        self._executor.shutdown(wait=True)
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None

    def submit(self, cap: Capture) -> None:
        """Journal a finished capture and hand it to the recorder; never blocks, never raises."""
        if self._journal_fd is not None:
            try:
                entry = journal_entry(cap, self.redactor)
                os.write(self._journal_fd, entry)
                self._journal_bytes += len(entry)
                self._journal_failed = False
            except Exception as e:  # a full disk must not fail the request
                if not self._journal_failed:
                    log.error("cannot append turn %s to %s (%s); it is only in memory until "
                              "stored", cap.request_id, self.journal_path, e)
                self._journal_failed = True
        try:
            self.queue.put_nowait(cap)
        except asyncio.QueueFull:
            self.overflow += 1
            self._overflowed.add(cap.request_id)
            log.error("recorder queue full (%d): turn %s waits in %s until the queue drains; the "
                      "store is too slow", self.queue.maxsize, cap.request_id, self.journal_path)

    def stats(self) -> dict[str, Any]:
        return {
            "queue_depth": self.queue.qsize(),
            "turns_recorded": self.recorded,
            "spool_records": self.spooled,
            "quarantined": self.quarantined,
            "turns_lost": self.lost,
            "queue_overflow": self.overflow,
            "store_ok": self.store_ok,
            "journal_ok": self._journal_fd is not None and not self._journal_failed,
            "last_error": self.last_error,
            "last_loss": self.last_loss,
        }

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            await self._quiet_moment()
            while len(batch) < 64 and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            try:
                await loop.run_in_executor(self._executor, self._process, batch)
            except Exception:  # a bug here must not kill recording for good
                log.exception("recorder: batch of %d failed", len(batch))
            finally:
                for _ in batch:
                    self.queue.task_done()
            # Everything journaled was queued at the same moment, or overflowed: once the queue is
            # empty and the overflowed turns are read back from the journal, every journaled turn
            # is in the store, spool or quarantine, and the journal can go.
            if self.queue.empty() and self._overflowed:
                ids, self._overflowed = self._overflowed, set()
                try:
                    await loop.run_in_executor(self._executor, self._replay_overflow, ids)
                except Exception:
                    log.exception("recorder: reading %d overflowed turn(s) back failed; they stay "
                                  "in %s for the next start", len(ids), self.journal_path)
                    self._overflowed |= ids
            if self.queue.empty() and not self._overflowed:
                self._truncate_journal()

    async def _quiet_moment(self) -> None:
        """Wait until no request is in flight, at most QUIET_WAIT_S and while the queue is less
        than half full. The worker thread shares the GIL with the event loop: a batch it takes
        while streams are relayed delays their chunks (every turn is journaled already)."""
        if self.busy is None:
            return
        deadline = time.monotonic() + QUIET_WAIT_S
        while (self.busy() and time.monotonic() < deadline
               and self.queue.qsize() < self.queue.maxsize // 2):
            await asyncio.sleep(0.005)

    def _truncate_journal(self) -> None:
        if self._journal_fd is not None and self._journal_bytes:
            try:
                os.ftruncate(self._journal_fd, 0)
                self._journal_bytes = 0
            except OSError as e:
                log.error("cannot truncate %s (%s)", self.journal_path, e)

    async def _finalize_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.finalize_interval_s)
            try:
                await loop.run_in_executor(self._executor, self._finalize)
            except Exception:
                log.exception("recorder: finalizing idle sessions failed")

    # -- worker thread -----------------------------------------------------------------------------
    def _startup(self) -> None:
        self._open_and_replay()
        self._count_quarantine()
        # Turns a kill caught between the journal and the store (ingest skips those stored).
        caps = read_journal(self.journal_path)
        if caps:
            log.warning("replaying %d turn(s) from %s (the proxy was killed)", len(caps),
                        self.journal_path)
            self._process(caps)
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._journal_fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.ftruncate(self._journal_fd, 0)
        except OSError as e:
            self._journal_fd = None
            log.error("RECORDING AT RISK: cannot open %s (%s); a killed proxy loses its last "
                      "turns", self.journal_path, e)

    def _replay_overflow(self, ids: set[str]) -> None:
        caps = [c for c in read_journal(self.journal_path) if c.request_id in ids]
        log.warning("recording %d overflowed turn(s) from %s", len(caps), self.journal_path)
        self._process(caps)

    def _open_and_replay(self) -> None:
        self._last_open_try = time.monotonic()
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.store = Store(self.cfg.db_path)
            self.store_ok = True
        except Exception as e:
            self.store, self.store_ok = None, False
            self.last_error = f"cannot open store: {e}"
            log.error("STORE UNAVAILABLE (%s); recording to %s until it works", e, self.spool_path)
            self.spooled = self._count_spool()
            return
        self._replay_spool()
        self._replay_quarantine_file()

    def _spool_captures(self, caps: list[Capture]) -> None:
        for cap in caps:
            try:
                self._spool(parse_capture(cap, self.redactor))
            except Exception as e:
                self._quarantine_capture(cap, e)

    def _close_store(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def _process(self, batch: list[Capture]) -> None:
        if self.store is None and time.monotonic() - self._last_open_try >= self.reopen_interval_s:
            self._open_and_replay()
        for cap in batch:
            try:
                rec = parse_capture(cap, self.redactor)
            except Exception as e:
                self._quarantine_capture(cap, e)
                continue
            try:
                self._write(rec)
            except Exception as e:  # each record alone: one bad turn never costs the batch
                self._quarantine(rec.get("request_id"), f"recorder error: {type(e).__name__}: {e}",
                                 rec)
            time.sleep(0)  # let the event loop have the GIL between records

    def _write(self, rec: dict[str, Any]) -> bool:
        if self.store is None:
            self._spool(rec)
            return False
        if not self.store_ok and not self._replay_spool():
            # Older turns still wait in the spool: queue behind them. Written first, this turn
            # would take its session's pending slot, and replaying the older ones after it would
            # link it to a next state that came before it.
            self._spool(rec)
            return False
        try:
            if rec.get("weight_version") is None:
                hv = rec.get("header_weight_version")
                if hv is None:
                    hv = rec.get("routed_weight_version")
                rec["weight_version"] = hv if hv is not None else self.store.latest_weight_version(rec.get("user"))
                if rec.get("weight_versions") is None and rec["status"] == "ok":
                    rec["weight_versions"] = [rec["weight_version"]]
            self.tracker.ingest(self.store, rec)
        except Exception as e:
            self.tracker.forget()
            if is_store_failure(e):
                self.store_ok = False
                self.last_error = f"store write failed: {e}"
                log.error("STORE WRITE FAILED for turn %s (%s); spooled to %s",
                          rec["request_id"], e, self.spool_path)
                self._spool(rec)
            else:
                self._quarantine(rec["request_id"], f"cannot store: {type(e).__name__}: {e}", rec)
            return False
        self.recorded += 1
        if not self.store_ok:
            self.store_ok = True
            self.last_error = None
            self._replay_spool()
        return True

    # -- quarantine --------------------------------------------------------------------------------
    def _quarantine_capture(self, cap: Capture, e: BaseException) -> None:
        self._quarantine(cap.request_id, f"cannot parse: {type(e).__name__}: {e}", None,
                         raw_turn_text(cap, self.redactor))

    def _quarantine(self, request_id: str | None, reason: str, rec: dict[str, Any] | None,
                    text: str | None = None) -> None:
        """Keep one turn aside with its reason: the store's quarantine table, else a file."""
        if text is None:
            try:
                text = orjson.dumps(rec).decode()
            except Exception:
                text = repr(rec)[:100_000]
        log.warning("turn %s quarantined: %s", request_id, reason)
        self.quarantined += 1
        if self.store is not None and self.store_ok:
            try:
                self.store.quarantine(request_id, reason, text)
                return
            except Exception as e:
                log.error("cannot quarantine turn %s in the store (%s); using %s", request_id, e,
                          self.quarantine_path)
        line = orjson.dumps({"request_id": request_id, "created_at": time.time(),
                             "reason": reason, "record": text})
        if not self._append(self.quarantine_path, line):
            self.quarantined -= 1
            self.lost += 1

    def _count_quarantine(self) -> None:
        n = 0
        if self.store is not None:
            try:
                n = self.store.quarantine_count()
            except Exception as e:
                log.error("cannot count quarantined turns (%s)", e)
        self.quarantined = n + self._count_lines([self.quarantine_path])

    def _replay_quarantine_file(self) -> None:
        """Quarantined while the store was down: move them into the table."""
        if self.store is None or not self.quarantine_path.exists():
            return
        try:
            rows = []
            for line in self.quarantine_path.read_bytes().splitlines():
                try:
                    q = orjson.loads(line)
                except orjson.JSONDecodeError:  # a blank or torn line
                    continue
                rows.append((q.get("request_id"), q.get("reason") or "?", q.get("record")))
            self.store.quarantine_many(rows)  # all or none: the file goes only once they are in
            self.quarantine_path.unlink()
        except Exception as e:
            log.error("cannot move %s into the store (%s); kept", self.quarantine_path, e)

    # -- spool -------------------------------------------------------------------------------------
    def _append(self, path: Path, line: bytes) -> bool:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            return True
        except OSError as e:
            self.last_loss = f"cannot write {path.name}: {e}"
            log.error("RECORD LOST: cannot write %s (%s)", path, e)
            return False

    def _spool(self, rec: dict[str, Any]) -> None:
        try:
            line = orjson.dumps(rec)
        except Exception as e:
            self._quarantine(rec.get("request_id"), f"cannot serialize: {e}", None, repr(rec)[:100_000])
            return
        if self._append(self.spool_path, line):
            self.spooled += 1
        else:
            self.lost += 1

    def _count_spool(self) -> int:
        return self._count_lines(self._spool_files())

    @staticmethod
    def _count_lines(paths: list[Path]) -> int:
        n = 0
        for p in paths:
            try:
                with open(p, "rb") as f:
                    n += sum(1 for line in f if line.strip())
            except OSError:
                pass
        return n

    def _spool_files(self) -> list[Path]:
        if not self.data_dir.exists():
            return []
        return sorted(self.data_dir.glob("spool*.jsonl"))

    def _replay_spool(self) -> bool:
        """Feed spooled records into the store, oldest first; True when the spool is empty after.

        Ingest is idempotent (request_id is unique). While the store still fails, the first record
        fails alone and the files are left as they are, so retrying costs one write per call. A
        record the store refuses for its own sake is quarantined, never retried forever.
        """
        if self.store is None:
            return False
        try:
            files = self._spool_files()
            if not files:
                self.spooled = 0
                return True
            if not self._probe_spool(files[0]):
                return False
            return self._replay_files(files)
        except OSError as e:
            self.last_error = f"spool replay failed: {e}"
            log.error("spool replay failed (%s); the spool is kept", e)
            return False

    def _replay_files(self, files: list[Path]) -> bool:
        replayed = failed = 0
        broken = False
        for p in files:
            work = p.with_name(f"spool-replay-{int(time.time() * 1000)}-{os.getpid()}.jsonl")
            if p.name.startswith("spool-replay-"):
                work = p
            else:
                os.replace(p, work)
            with open(work, "rb") as f:
                lines = [line for line in f if line.strip()]
            for line in lines:
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    self._quarantine(None, "corrupt spool line", None,
                                     line.decode("utf-8", "replace"))
                    continue
                if self.store is not None and not broken:
                    try:
                        self.tracker.ingest(self.store, rec)
                        replayed += 1
                        self.recorded += 1
                        continue
                    except Exception as e:
                        self.tracker.forget()
                        if not is_store_failure(e):
                            self._quarantine(rec.get("request_id"),
                                             f"cannot store: {type(e).__name__}: {e}", rec)
                            continue
                        self.store_ok = False
                        self.last_error = f"store write failed during replay: {e}"
                        log.error("spool replay failed (%s); keeping the rest", e)
                        broken = True
                failed += 1
                self._append_spool_line(line)
            work.unlink()
        self.spooled = failed
        if replayed:
            log.info("replayed %d spooled turn(s) into the store", replayed)
        return failed == 0

    def _probe_spool(self, path: Path) -> bool:
        """Write the oldest spooled record; False (files untouched) if the store still fails."""
        assert self.store is not None
        with open(path, "rb") as f:
            line = next((x for x in f if x.strip()), None)
        try:
            rec = orjson.loads(line) if line is not None else None
        except orjson.JSONDecodeError:
            return True  # the full replay quarantines it
        if rec is None:
            return True
        try:
            self.tracker.ingest(self.store, rec)
        except Exception as e:
            self.tracker.forget()
            if not is_store_failure(e):
                return True  # the full replay quarantines it
            self.store_ok = False
            self.last_error = f"store write failed during replay: {e}"
            return False
        return True

    def _append_spool_line(self, line: bytes) -> None:
        fd = os.open(self.spool_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line if line.endswith(b"\n") else line + b"\n")
        finally:
            os.close(fd)

    def _finalize(self) -> None:
        if self.store is None:
            return
        try:
            self.tracker.finalize_idle(self.store)
        except Exception as e:
            log.error("finalizing idle sessions failed: %s", e)
