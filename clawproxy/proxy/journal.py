"""The crash journal: ``<data_dir>/journal.bin``, each finished turn appended before the client's
last byte goes out.

One ``write`` per turn, no fsync: it survives a SIGKILL of the proxy, not a power cut. The recorder
truncates it once everything journaled is stored, spooled or quarantined, and replays it at start
(ingest is idempotent by request_id), so turns a kill caught between journal and store are kept.
An entry is a meta line, the request body and the response, redacted first (by structure and by
format) when a redactor is given, so no secret reaches the disk. A torn last entry (killed
mid-write) is the turn whose last byte the client never got: it is skipped.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import fields
from pathlib import Path

import orjson

from clawproxy.proxy.redact import Redactor, redact_body
from clawproxy.proxy.sse import Assembled, assemble_json, assemble_stream
from clawproxy.proxy.tap import Capture, clean_header
from clawproxy.proxy.trying import Served

log = logging.getLogger("clawproxy.recorder")
JOURNAL_MAGIC = b"CJ1 "
# Token ids and log-probs stay out of the redaction: log-probs name each sampled piece "token".
TOKEN_FIELDS = ("prompt_token_ids", "completion_token_ids", "completion_logprobs")
_ASSEMBLED_FIELDS = tuple(f.name for f in fields(Assembled))  # fields() per turn costs ~10 us


def journal_entry(cap: Capture, redactor: Redactor | None = None) -> bytes:
    """One journal record: meta line, request body, response.

    A 2xx answer is journaled as the turn the tap built (a few hundred bytes of text to redact,
    where the raw stream is tens of KB of envelopes); any other as the upstream's bytes, which the
    recorder may need for the error. The body may have been redacted earlier
    (``Capture.journal_body``: while the upstream generated).
    """
    body = cap.raw_body
    redacted = False
    error = cap.error
    if redactor is not None:
        body, redacted = cap.journal_body or redact_body(redactor, cap.body, cap.raw_body)
        if error is not None:
            error = redactor.text(error)  # it may quote the upstream's error body
    asm = cap.assembled if cap.http_status is not None and cap.http_status < 400 else None
    if asm is not None:
        turn = {name: getattr(asm, name) for name in _ASSEMBLED_FIELDS}
        tokens = {k: turn.pop(k) for k in TOKEN_FIELDS}
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
        "done": cap.done, "http": cap.http_status, "status": cap.status, "error": error,
        "h": {k: clean_header(v) for k, v in cap.session_headers.items()},
        "wv": cap.header_weight_version, "u": cap.user, "rv": cap.routed_version,
        "sv": None if cap.served is None else {"text": cap.served.text, "tried": cap.served.tried,
                                               "applied": list(cap.served.applied), "role": cap.served.role},
        "ttft": cap.t_first - cap.t0 if cap.t_first else None,
        "total": (cap.t_end or time.perf_counter()) - cap.t0,
        "nb": len(body), "nr": len(resp), "red": redacted or cap.redacted, "asm": asm is not None,
        "v": 2,  # the outcome in "status" is final (older entries: the recorder worked it out)
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
        if m.get("sv"):
            sv = m["sv"]
            cap.served = Served(sv["text"], sv["tried"], tuple(sv["applied"]), sv["role"])
        resp = data[nl + 1 + m["nb"] : end]
        if m.get("asm"):
            rec = orjson.loads(resp)
            cap.assembled = Assembled(**rec["turn"], **rec["tokens"])
        else:
            cap.chunks.append(resp)
        if m.get("v", 1) < 2:
            settle_legacy(cap)
        out.append(cap)
        pos = end
    return out


def settle_legacy(cap: Capture) -> None:
    """The outcome of an entry written before the tap decided it (a journal an older proxy left)."""
    raw = b"".join(cap.chunks)
    asm = None
    if cap.http_status is not None and cap.http_status < 400:
        if cap.assembled is None and raw:
            cap.assembled = assemble_stream(raw) if cap.stream else assemble_json(raw)
        asm = cap.assembled
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
    cap.status, cap.error = status, error


class Journal:
    """The open journal file: ``append`` on the request path, the rest in the recorder's thread."""

    def __init__(self, path: Path, redactor: Redactor | None):
        self.path = path
        self.redactor = redactor
        self._fd: int | None = None
        self._bytes = 0
        self._failed = False

    @property
    def ok(self) -> bool:
        """Open, and the last append worked."""
        return self._fd is not None and not self._failed

    def read(self) -> list[Capture]:
        return read_journal(self.path)

    def open(self) -> None:
        """Open for appending, empty (read what a kill left first)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.ftruncate(self._fd, 0)
        except OSError as e:
            self._fd = None
            log.error("RECORDING AT RISK: cannot open %s (%s); a killed proxy loses its last "
                      "turns", self.path, e)

    def append(self, cap: Capture) -> None:
        """Journal one finished turn; never raises (a full disk must not fail the request)."""
        if self._fd is None:
            return
        try:
            entry = journal_entry(cap, self.redactor)
            os.write(self._fd, entry)
            self._bytes += len(entry)
            self._failed = False
        except Exception as e:
            if not self._failed:
                log.error("cannot append turn %s to %s (%s); it is only in memory until stored",
                          cap.request_id, self.path, e)
            self._failed = True

    def truncate(self) -> None:
        """Everything journaled is stored, spooled or quarantined."""
        if self._fd is not None and self._bytes:
            try:
                os.ftruncate(self._fd, 0)
                self._bytes = 0
            except OSError as e:
                log.error("cannot truncate %s (%s)", self.path, e)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
