"""The recorder: takes captured turns off the request path and writes them to the store.

The request path only appends raw bytes to a ``Capture`` and hands it over with ``submit`` (a
non-blocking put on a bounded queue). An owned task drains the queue in batches and runs all the
expensive work (SSE reassembly, session tracking, SQLite writes) in one worker thread, because
``Store`` is synchronous and the tracker's state wants a single writer.

If the store cannot be opened or a write fails, the request has already succeeded; the record is
logged loudly and appended to ``<data_dir>/spool.jsonl``, which is replayed into the store at the
next start and as soon as a write succeeds again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from clawproxy.config import Config
from clawproxy.errors import StoreError
from clawproxy.proxy.sessions import SessionTracker, body_hash
from clawproxy.proxy.sse import assemble_events, assemble_json, assemble_stream
from clawproxy.store import Store

log = logging.getLogger("clawproxy.recorder")
# What "the store failed" looks like (spool and retry); anything else is a bug in the recorder.
STORE_FAILURES = (sqlite3.Error, StoreError, OSError)


@dataclass(slots=True)
class Capture:
    """What the request path saw of one chat-completions call. Filled cheaply, parsed later."""

    request_id: str
    created_at: float
    path: str
    t0: float  # perf_counter at arrival
    body: dict[str, Any] | None = None
    session_headers: dict[str, str] = field(default_factory=dict)
    stream: bool = False
    http_status: int | None = None
    status: str = "ok"
    error: str | None = None
    chunks: list[bytes] = field(default_factory=list)
    events: list[bytes | dict[str, Any]] | None = None  # whole events, when the hot path framed them
    header_weight_version: int | None = None
    t_first: float | None = None
    t_end: float | None = None


def parse_capture(cap: Capture) -> dict[str, Any]:
    """Turn a capture into a plain, JSON-serializable record (also the spool format)."""
    raw = b"".join(cap.chunks)
    asm = None
    if cap.http_status is not None and cap.http_status < 400:
        if cap.events is not None:
            asm = assemble_events(cap.events)
        elif raw:
            asm = assemble_stream(raw) if cap.stream else assemble_json(raw)
    status, error = cap.status, cap.error
    if asm is not None and asm.error and status == "ok":
        status, error = "error", asm.error
    if cap.http_status is not None and cap.http_status >= 400 and status == "ok":
        status = "error"
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
        "session_headers": cap.session_headers,
        "body_hash": body_hash(body) if body else None,
        "ttft_ms": (cap.t_first - cap.t0) * 1000 if cap.t_first else None,
        "total_ms": ((cap.t_end or time.perf_counter()) - cap.t0) * 1000,
        "header_weight_version": cap.header_weight_version,
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
    return rec


class Recorder:
    """Bounded queue + owned drain task + single worker thread + spool. See the module docstring."""

    def __init__(self, cfg: Config, *, reopen_interval_s: float = 2.0, finalize_interval_s: float | None = None):
        self.cfg = cfg
        self.data_dir = cfg.data_path
        self.spool_path = self.data_dir / "spool.jsonl"
        self.queue: asyncio.Queue[Capture] = asyncio.Queue(maxsize=cfg.proxy.recorder_queue_size)
        self.tracker = SessionTracker(cfg.sessions.retry_window_s, cfg.sessions.idle_timeout_s)
        self.reopen_interval_s = reopen_interval_s
        self.finalize_interval_s = finalize_interval_s or min(60.0, cfg.sessions.idle_timeout_s / 4)
        self.store: Store | None = None
        self.store_ok = False
        self.recorded = 0
        self.spooled = 0
        self.dropped = 0
        self.last_error: str | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="clawproxy-recorder")
        self._tasks: list[asyncio.Task] = []
        self._last_open_try = 0.0

    # -- lifecycle (event loop) ------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._open_and_replay)
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
        await loop.run_in_executor(self._executor, self._close_store)
        self._executor.shutdown(wait=True)

    def submit(self, cap: Capture) -> None:
        """Hand a finished capture to the recorder; never blocks, never raises."""
        try:
            self.queue.put_nowait(cap)
        except asyncio.QueueFull:
            self.dropped += 1
            log.error(
                "recorder queue full (%d): turn %s not recorded; the store is too slow",
                self.queue.maxsize, cap.request_id,
            )

    def stats(self) -> dict[str, Any]:
        return {
            "queue_depth": self.queue.qsize(),
            "turns_recorded": self.recorded,
            "spool_records": self.spooled,
            "dropped": self.dropped,
            "store_ok": self.store_ok,
            "last_error": self.last_error,
        }

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            while len(batch) < 64 and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            try:
                await loop.run_in_executor(self._executor, self._process, batch)
            except Exception:  # a bug here must not kill recording for good
                log.exception("recorder: batch of %d failed", len(batch))
            finally:
                for _ in batch:
                    self.queue.task_done()

    async def _finalize_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.finalize_interval_s)
            try:
                await loop.run_in_executor(self._executor, self._finalize)
            except Exception:
                log.exception("recorder: finalizing idle sessions failed")

    # -- worker thread -----------------------------------------------------------------------------
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

    def _spool_captures(self, caps: list[Capture]) -> None:
        for cap in caps:
            try:
                self._spool(parse_capture(cap))
            except Exception:
                log.exception("recorder: cannot parse turn %s; skipped", cap.request_id)

    def _close_store(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def _process(self, batch: list[Capture]) -> None:
        if self.store is None and time.monotonic() - self._last_open_try >= self.reopen_interval_s:
            self._open_and_replay()
        for cap in batch:
            try:
                rec = parse_capture(cap)
            except Exception:
                log.exception("recorder: cannot parse turn %s; skipped", cap.request_id)
                continue
            self._write(rec)
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
                rec["weight_version"] = hv if hv is not None else self.store.latest_weight_version()
                if rec.get("weight_versions") is None and rec["status"] == "ok":
                    rec["weight_versions"] = [rec["weight_version"]]
            self.tracker.ingest(self.store, rec)
        except STORE_FAILURES as e:
            self.tracker.forget()
            self.store_ok = False
            self.last_error = f"store write failed: {e}"
            log.error("STORE WRITE FAILED for turn %s (%s); spooled to %s",
                      rec["request_id"], e, self.spool_path)
            self._spool(rec)
            return False
        except Exception:
            # A bug of ours, not the store: replaying would fail again, so keep it aside.
            self.tracker.forget()
            log.exception("cannot record turn %s; kept in %s", rec["request_id"],
                          self.data_dir / "rejected.jsonl")
            self._spool(rec, self.data_dir / "rejected.jsonl")
            return False
        self.recorded += 1
        if not self.store_ok:
            self.store_ok = True
            self._replay_spool()
        return True

    def _spool(self, rec: dict[str, Any], path: Path | None = None) -> None:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path or self.spool_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, orjson.dumps(rec) + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            if path is None:
                self.spooled += 1
        except OSError as e:
            self.dropped += 1
            log.error("cannot spool turn %s to %s (%s): record lost", rec["request_id"], self.spool_path, e)

    def _count_spool(self) -> int:
        n = 0
        for p in self._spool_files():
            with open(p, "rb") as f:
                n += sum(1 for line in f if line.strip())
        return n

    def _spool_files(self) -> list[Path]:
        if not self.data_dir.exists():
            return []
        return sorted(self.data_dir.glob("spool*.jsonl"))

    def _replay_spool(self) -> bool:
        """Feed spooled records into the store, oldest first; True when the spool is empty after.

        Ingest is idempotent (request_id is unique). While the store still fails, the first record
        fails alone and the files are left as they are, so retrying costs one write per call.
        """
        if self.store is None:
            return False
        files = self._spool_files()
        if not files:
            self.spooled = 0
            return True
        if not self._probe_spool(files[0]):
            return False
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
                    log.error("spool: skipping a corrupt line in %s", work)
                    continue
                if self.store is not None and not broken:
                    try:
                        self.tracker.ingest(self.store, rec)
                        replayed += 1
                        self.recorded += 1
                        continue
                    except STORE_FAILURES as e:
                        self.tracker.forget()
                        self.store_ok = False
                        self.last_error = f"store write failed during replay: {e}"
                        log.error("spool replay failed (%s); keeping the rest", e)
                        broken = True
                    except Exception:
                        self.tracker.forget()
                        log.exception("spool: cannot replay turn; moved to rejected.jsonl")
                        self._spool(rec, self.data_dir / "rejected.jsonl")
                        continue
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
            return True  # the full replay skips it
        if rec is None:
            return True
        try:
            self.tracker.ingest(self.store, rec)
        except STORE_FAILURES as e:
            self.tracker.forget()
            self.store_ok = False
            self.last_error = f"store write failed during replay: {e}"
            return False
        except Exception:
            self.tracker.forget()
            return True  # the full replay moves it to rejected.jsonl
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
