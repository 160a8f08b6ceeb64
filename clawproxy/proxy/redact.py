"""Secrets (API keys, tokens, passwords, private keys) replaced by ``[REDACTED]`` before anything is
stored, journaled or logged.

Two passes, both cheap enough for the request path (the journal is written there):

- ``tree``: by structure. A member whose name is in a secret family loses its value, whatever its
  type (``password: 853420832117`` too). Names are matched case-insensitively with ``_`` ``-`` ``.``
  ignored, so ``Password``, ``DB_PASSWORD``, ``session_token``, ``aws_secret_access_key`` and
  ``x-api-key`` are one family each. A string that holds JSON (tool-call ``arguments``, tool
  results) is parsed and redacted the same way. Names that count tokens (``max_tokens``,
  ``prompt_tokens``, ``completion_token_ids``) are no secret: a family name must *end* in ``token``.
- ``bytes``/``text``: by format, on serialized JSON or any text: known key formats (``sk-``, JWTs,
  AWS secret keys, Stripe, npm, GitHub, ...), ``Authorization: Bearer|Basic``, the password in
  ``scheme://user:pass@host``, and ``name=value`` / ``"name": "value"`` in text (a ``.env`` file a
  tool printed). No pattern matches a quote, nor a backslash outside a private-key block (replaced
  whole, inside one string), so serialized JSON and raw event streams stay valid.

The same patterns scrub log records (``RedactingFilter``).
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

import orjson

REDACTED = b"[REDACTED]"
REDACTED_TEXT = "[REDACTED]"

# Member names (lowercased, separators dropped) that hold a credential.
_SECRET_NAME = re.compile(
    r"password|passwd|passphrase|secret|credential|apikey|accesskey|privatekey|signingkey"
    r"|encryptionkey|masterkey|authorization|cookie|token$|^auth$|^pwd$|^pass$")
# Tokenizer vocabulary, not credentials (a chat template's kwargs carry them).
_NOT_SECRET = frozenset({"bostoken", "eostoken", "padtoken", "unktoken", "septoken", "clstoken",
                         "masktoken"})
_MAX_DEPTH = 64  # JSON nested in strings nested in JSON...: deeper than any real payload


@functools.lru_cache(maxsize=4096)
def secret_name(name: str) -> bool:
    """Whether a member called ``name`` holds a credential (``DB_Password`` yes, ``max_tokens`` no)."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return key not in _NOT_SECRET and _SECRET_NAME.search(key) is not None


def _basic(m: re.Match[bytes]) -> bytes:
    """``Basic <base64>`` only when it decodes to ``user:password`` (``basic understanding`` stays)."""
    try:
        raw = base64.b64decode(m.group(2) + b"=" * (-len(m.group(2)) % 4), validate=True)
    except (binascii.Error, ValueError):
        return m.group(0)
    return m.group(1) + REDACTED if b":" in raw else m.group(0)


def _aws_secret(m: re.Match[bytes]) -> bytes:
    """40 base64 characters with upper, lower and digits: an AWS secret key, not a git SHA or a word."""
    s = m.group(0)
    if re.search(rb"[A-Z]", s) and re.search(rb"[a-z]", s) and re.search(rb"[0-9]", s):
        return REDACTED
    return s


def _assignments(data: bytes, words: tuple[bytes, ...] | None = None) -> bytes:
    """``name=value`` or ``"name": value`` in text; prose (``the secret: patience``) stays."""
    low = data.lower()  # same length, same offsets
    if not any(w in low for w in words or _ASSIGNMENT_WORDS):
        return data
    out, last = [], 0
    for m in _ASSIGNMENT.finditer(low):
        start = m.start()
        if m.group("word") == b"token" and not (
                start and (low[start - 1 : start].isalnum()
                           or (low[start - 1 : start] in b"_.-" and low[start - 2 : start - 1].isalnum()))):
            continue  # `"token": "Hello"` is a log-prob entry; `session_token=` is a credential
        if m.group("q") or m.group("sep") == b"=" or re.search(rb"[0-9]", m.group("val")):
            out += [data[last : m.start("val")], REDACTED]
            last = m.end()
    return b"".join([*out, data[last:]]) if out else data


_B64_RUNS = bytes(ord("a") if chr(c).isascii() and (chr(c).isalnum() or chr(c) in "/+") else 32
                  for c in range(256))
_RUN_40 = b"a" * 40
# `name=value`, `"name": value` in text (matched on the lowercased bytes: (?i) is 10x slower). The
# family word ends the name; a bare `token` is left to the structural pass, since log-probs name
# every sampled piece "token".
_ASSIGNMENT = re.compile(
    rb"(?P<head>(?P<word>password|passwd|secret|token|api[_\-]?key|access[_\-]?key|private[_\-]?key"
    rb"|credentials?)(?P<q>\\?[\"'])?\s*(?P<sep>[:=])\s*(?:\\?[\"'])?)(?P<val>[^\s\"'\\,;&}<>]{4,})")
_ASSIGNMENT_WORDS = (b"passw", b"secret", b"token", b"key", b"credential")
_STREAM_WORDS = (b"passw", b"secret", b"key", b"credential")

# (literal, regex, replacement): the regex runs only when its literal occurs (a memchr-speed
# ``in``), which keeps a 50 KB body with no secret at a few microseconds per pattern.
_Prefilter = bytes | tuple[bytes, ...] | Callable[[bytes], bool]
_PATTERNS: list[tuple[_Prefilter, bytes, bytes | Callable[[re.Match[bytes]], bytes]]] = [
    (b"PRIVATE KEY-----",
     rb"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----[^\"]{0,20000}?-----END [A-Z ]{0,40}PRIVATE KEY-----", REDACTED),
    (b"sk-", rb"sk-[A-Za-z0-9_\-]{16,}", REDACTED),                  # OpenAI, Anthropic (sk-ant-), DeepSeek...
    (b"cpk-", rb"cpk-[A-Za-z0-9_\-]{16,}", REDACTED),                # clawproxy's own user keys (clawproxy/users.py)
    (b"_pat_", rb"github_pat_[A-Za-z0-9_]{20,}", REDACTED),
    (b"gh", rb"gh[oprsu]_[A-Za-z0-9]{20,}", REDACTED),               # GitHub
    (b"xox", rb"xox[abeprs]-[A-Za-z0-9\-]{10,}", REDACTED),          # Slack
    (b"hf_", rb"hf_[A-Za-z0-9]{20,}", REDACTED),                     # Hugging Face
    (b"AKIA", rb"(?:AKIA|ASIA)[0-9A-Z]{16}", REDACTED),              # AWS access key id
    (b"AIza", rb"AIza[0-9A-Za-z_\-]{30,}", REDACTED),               # Google API key
    (b"ya29.", rb"ya29\.[0-9A-Za-z_\-]{20,}", REDACTED),             # Google OAuth access token
    (b"glpat-", rb"glpat-[A-Za-z0-9_\-]{16,}", REDACTED),           # GitLab
    (b"eyJ", rb"eyJ[A-Za-z0-9_\-]{6,}\.eyJ[A-Za-z0-9_\-]{6,}\.[A-Za-z0-9_\-]{6,}", REDACTED),  # JWT
    ((b"k_live_", b"k_test_"), rb"[rs]k_(?:live|test)_[A-Za-z0-9]{10,}", REDACTED),  # Stripe
    (b"whsec_", rb"whsec_[A-Za-z0-9]{20,}", REDACTED),               # Stripe webhook secret
    (b"npm_", rb"npm_[A-Za-z0-9]{30,}", REDACTED),                   # npm
    (b"pypi-", rb"pypi-AgE[A-Za-z0-9_\-]{40,}", REDACTED),           # PyPI
    (b"SG.", rb"SG\.[A-Za-z0-9_\-]{16,}\.[A-Za-z0-9_\-]{16,}", REDACTED),  # SendGrid
    (b"dckr_pat_", rb"dckr_pat_[A-Za-z0-9_\-]{20,}", REDACTED),      # Docker Hub
    ((b"Bearer", b"bearer", b"BEARER"), rb"(?i:bearer)\s+[A-Za-z0-9._~+/=\-]{8,}", REDACTED),
    ((b"Basic", b"basic", b"BASIC"), rb"((?i:basic)\s+)([A-Za-z0-9+/]{6,}={0,2})", _basic),
    (b"://", rb"(\b[A-Za-z][A-Za-z0-9+.\-]{0,20}://[^\s/:@\"\\]{1,200}:)[^\s/@\"\\]{1,200}(?=@)",
     rb"\1" + REDACTED),                                            # user:pass@ in a URL
    (lambda d: d.translate(_B64_RUNS).find(_RUN_40) >= 0,  # a 40-character run at all: C speed
     rb"(?<![A-Za-z0-9/+])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])", _aws_secret),  # AWS secret key
]


class Redactor:
    """Compiled patterns; ``extra`` are more regexes from proxy.redact_patterns (always run)."""

    def __init__(self, extra: Iterable[str] = ()):
        # (literals, test, regex, replacement): a rule runs when one literal occurs, else when
        # ``test`` says so, else always. Plain tuples and an inline loop: a turn calls this a
        # few times on the event loop, and a call per rule cost more than the scans themselves.
        self._rules: list[tuple[tuple[bytes, ...] | None, Callable[[bytes], bool] | None,
                                re.Pattern[bytes], Any]] = []
        for pre, rx, repl in _PATTERNS:
            lits = (pre,) if isinstance(pre, bytes) else pre if isinstance(pre, tuple) else None
            test = pre if callable(pre) else None
            self._rules.append((lits, test, re.compile(rx, re.S), repl))
        for p in extra:
            self._rules.append((None, None, re.compile(p.encode()), REDACTED))

    def bytes(self, data: bytes, stream: bool = False) -> bytes:
        """Secrets by format in ``data`` (serialized JSON stays valid JSON). ``stream``: raw
        upstream bytes, where every log-prob entry says "token": ``name=value`` in text is then
        looked for only when another family word occurs (10x cheaper on such a stream)."""
        for lits, test, rx, repl in self._rules:
            if lits is not None:
                for lit in lits:
                    if lit in data:
                        break
                else:
                    continue
            elif test is not None and not test(data):
                continue
            data = rx.sub(repl, data)
        return _assignments(data, _STREAM_WORDS if stream else None)

    def text(self, s: str) -> str:
        return self.bytes(s.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")

    def tree(self, obj: Any, skip: frozenset[str] = frozenset()) -> tuple[Any, bool]:
        """``obj`` (parsed JSON) with the values of secret-named members redacted, JSON held in
        strings included; (the result, whether anything changed). ``skip``: top-level members to
        leave alone (the upstream's log-probs name each sampled piece ``token``)."""
        return _tree(obj, skip, 0)


def _tree(obj: Any, skip: frozenset[str], depth: int) -> tuple[Any, bool]:
    if depth > _MAX_DEPTH:
        return obj, False
    if isinstance(obj, dict):
        out, changed = {}, False
        for k, v in obj.items():
            if k in skip:
                out[k] = v
            elif (isinstance(k, str) and secret_name(k) and v not in (None, "", REDACTED_TEXT)
                  and not (isinstance(v, dict) and "type" in v)):  # a tool's JSON schema for it
                out[k], changed = REDACTED_TEXT, True
            else:
                out[k], ch = _tree(v, frozenset(), depth + 1)
                changed |= ch
        return (out, True) if changed else (obj, False)
    if isinstance(obj, list):
        items = [_tree(v, frozenset(), depth + 1) for v in obj]
        if any(ch for _, ch in items):
            return [v for v, _ in items], True
        return obj, False
    if isinstance(obj, str) and len(obj) > 7 and obj.lstrip()[:1] in ("{", "["):
        try:
            inner = orjson.loads(obj)
        except orjson.JSONDecodeError:
            return obj, False
        if isinstance(inner, (dict, list)):
            new, changed = _tree(inner, frozenset(), depth + 1)
            if changed:
                return orjson.dumps(new).decode(), True
    return obj, False


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


class RedactingFilter(logging.Filter):
    """Scrubs secrets from a log record's message and arguments (attached to log handlers)."""

    def __init__(self, redactor: Redactor | None = None):
        super().__init__()
        self.redactor = redactor or Redactor()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # a broken format string: let logging report it as usual
            return True
        clean = self.redactor.text(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        return True
