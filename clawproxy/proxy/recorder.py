"""The recorder: takes captured turns off the request path and writes them to the store.

The request path hands each finished ``Capture`` to ``submit``, which appends it to the journal
(``journal.py``, before the client's last byte) and puts it on a bounded queue. An owned task
drains the queue in batches and runs the expensive work (building the record, redaction, session
tracking, SQLite writes) in one worker thread; once the queue is empty after a batch, everything
journaled is stored and the journal is truncated. At start, the journal is replayed.

Failures are kept apart: the store fails, the record goes to the spool (``spool.py``), replayed at
the next start and as soon as a write succeeds again; if the spool cannot be written either, the
turn is counted as lost (health and stats show it). One record cannot be stored: it goes alone to
the quarantine (``quarantine.py``) with the reason. Secret-looking strings are redacted before a
record reaches the store, spool or quarantine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from clawproxy.config import Config
from clawproxy.proxy.journal import TOKEN_FIELDS, Journal
from clawproxy.proxy.quarantine import Quarantine
from clawproxy.proxy.redact import Redactor, redact_body
from clawproxy.proxy.sessions import SessionTracker, body_hash
from clawproxy.proxy.spool import Spool, is_store_failure
from clawproxy.proxy.sse import assemble_json, assemble_stream
from clawproxy.proxy.tap import Capture, clean_header
from clawproxy.store import Store

log = logging.getLogger("clawproxy.recorder")
QUIET_WAIT_S = 1.0  # the longest a turn waits to be stored while requests keep the loop busy
# Text columns a client or upstream can fill with any JSON value: stored as text whatever came.
_TEXT_FIELDS = ("model", "finish_reason", "error", "response_text", "response_reasoning")


def parse_capture(cap: Capture, redactor: Redactor | None = None) -> dict[str, Any]:
    """Turn a capture into a plain, JSON-serializable record (also the spool format).

    Raises (TypeError, ValueError, orjson.JSONEncodeError...) when the turn cannot be represented;
    the recorder quarantines it with the reason. The outcome is the capture's, as the tap decided it.
    """
    asm = None
    if cap.http_status is not None and cap.http_status < 400:
        asm = cap.assembled
        if asm is None and cap.chunks:  # a capture the tap did not build (made by hand, or old)
            raw = b"".join(cap.chunks)
            asm = assemble_stream(raw) if cap.stream else assemble_json(raw)
    status, error = cap.status, cap.error  # decided by the tap (tap.py), once
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
    if cap.served is not None:
        rec.update(instruction=cap.served.text, instruction_id=cap.served.tried,
                   applied_ids=list(cap.served.applied) or None, instruction_role=cap.served.role)
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
        tokens = {k: rec.pop(k) for k in TOKEN_FIELDS if k in rec}
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


def raw_turn_text(cap: Capture, redactor: Redactor | None) -> str:
    """What a quarantined turn keeps when it has no record: its raw request and response."""
    data = b"request: " + cap.raw_body + b"\nresponse: " + b"".join(cap.chunks)
    if redactor is not None:
        data = redactor.bytes(data)
    return data.decode("utf-8", "replace")




class Recorder:
    """Journal + bounded queue + owned drain task + one worker thread + spool + quarantine."""

    def __init__(self, cfg: Config, *, reopen_interval_s: float = 2.0, finalize_interval_s: float | None = None,
                 busy: Callable[[], bool] | None = None):
        self.cfg = cfg
        self.busy = busy  # whether requests are in flight: the worker then waits (QUIET_WAIT_S)
        self.data_dir = cfg.data_path
        self.redactor = Redactor(cfg.proxy.redact_patterns) if cfg.proxy.redact_secrets else None
        self.journal = Journal(self.data_dir / "journal.bin", self.redactor)
        self.spool = Spool(self.data_dir)
        self.quarantine = Quarantine(self.data_dir)
        self.queue: asyncio.Queue[Capture] = asyncio.Queue(maxsize=cfg.proxy.recorder_queue_size)
        self.tracker = SessionTracker(cfg.sessions.retry_window_s, cfg.sessions.idle_timeout_s)
        self.reopen_interval_s = reopen_interval_s
        self.finalize_interval_s = finalize_interval_s or min(60.0, cfg.sessions.idle_timeout_s / 4)
        self.store: Store | None = None
        self.store_ok = False
        self.recorded = 0
        self.lost = 0  # neither stored, spooled nor quarantined (store and disk both failed)
        self.overflow = 0  # queue full: kept only in the journal until the queue drains
        self._overflowed: set[str] = set()  # their request ids, replayed from the journal
        self.last_error: str | None = None
        self.last_loss: str | None = None  # why the last lost turn could not even be spooled
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clawproxy-recorder")
        self._tasks: list[asyncio.Task[None]] = []
        self._last_open_try = 0.0

    @property
    def journal_path(self) -> Path:
        return self.journal.path

    @property
    def spool_path(self) -> Path:
        return self.spool.path

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
                      self.queue.qsize(), self.spool.path)
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
            self.journal.truncate()
        await loop.run_in_executor(self._executor, self._close_store)
        self._executor.shutdown(wait=True)
        self.journal.close()

    def submit(self, cap: Capture) -> None:
        """Journal a finished capture and hand it to the recorder; never blocks, never raises."""
        self.journal.append(cap)
        try:
            self.queue.put_nowait(cap)
        except asyncio.QueueFull:
            self.overflow += 1
            self._overflowed.add(cap.request_id)
            log.error("recorder queue full (%d): turn %s waits in %s until the queue drains; the "
                      "store is too slow", self.queue.maxsize, cap.request_id, self.journal.path)

    def stats(self) -> dict[str, Any]:
        return {
            "queue_depth": self.queue.qsize(),
            "turns_recorded": self.recorded,
            "spool_records": self.spool.records,
            "quarantined": self.quarantine.count,
            "turns_lost": self.lost,
            "queue_overflow": self.overflow,
            "store_ok": self.store_ok,
            "journal_ok": self.journal.ok,
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
                                  "in %s for the next start", len(ids), self.journal.path)
                    self._overflowed |= ids
            if self.queue.empty() and not self._overflowed:
                self.journal.truncate()

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
        self.quarantine.recount(self.store)
        # Turns a kill caught between the journal and the store (ingest skips those stored).
        caps = self.journal.read()
        if caps:
            log.warning("replaying %d turn(s) from %s (the proxy was killed)", len(caps),
                        self.journal.path)
            self._process(caps)
        self.journal.open()

    def _replay_overflow(self, ids: set[str]) -> None:
        caps = [c for c in self.journal.read() if c.request_id in ids]
        log.warning("recording %d overflowed turn(s) from %s", len(caps), self.journal.path)
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
            log.error("STORE UNAVAILABLE (%s); recording to %s until it works", e, self.spool.path)
            self.spool.count()
            return
        self._replay_spool()
        self.quarantine.move_into(self.store)

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
                          rec["request_id"], e, self.spool.path)
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

    def _ingest(self, rec: dict[str, Any]) -> None:
        assert self.store is not None
        try:
            self.tracker.ingest(self.store, rec)
        except Exception:
            self.tracker.forget()
            raise

    def _replay_spool(self) -> bool:
        """Spooled records into the store, oldest first; True when the spool is empty after."""
        if self.store is None:
            return False
        try:
            r = self.spool.replay(self._ingest, lambda rec, reason, text: self._quarantine(
                rec.get("request_id") if rec else None, reason, rec, text))
        except OSError as e:
            self.last_error = f"spool replay failed: {e}"
            log.error("spool replay failed (%s); the spool is kept", e)
            return False
        self.recorded += r.replayed
        if r.failure is not None:
            self.store_ok = False
            self.last_error = f"store write failed during replay: {r.failure}"
        return r.empty

    def _spool(self, rec: dict[str, Any]) -> None:
        try:
            line = orjson.dumps(rec)
        except Exception as e:
            self._quarantine(rec.get("request_id"), f"cannot serialize: {e}", None, repr(rec)[:100_000])
            return
        try:
            self.spool.append(line)
        except OSError as e:
            self.last_loss = f"cannot write {self.spool.path.name}: {e}"
            log.error("RECORD LOST: cannot write %s (%s)", self.spool.path, e)
            self.lost += 1

    def _quarantine_capture(self, cap: Capture, e: BaseException) -> None:
        self._quarantine(cap.request_id, f"cannot parse: {type(e).__name__}: {e}", None,
                         raw_turn_text(cap, self.redactor))

    def _quarantine(self, request_id: str | None, reason: str, rec: dict[str, Any] | None,
                    text: str | None = None) -> None:
        store = self.store if self.store_ok else None
        if not self.quarantine.keep(store, request_id, reason, rec, text):
            self.lost += 1
            self.last_loss = self.quarantine.last_loss

    def _finalize(self) -> None:
        if self.store is None:
            return
        try:
            self.tracker.finalize_idle(self.store)
        except Exception as e:
            log.error("finalizing idle sessions failed: %s", e)
