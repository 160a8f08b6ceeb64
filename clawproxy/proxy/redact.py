"""Secret-looking strings (API keys, bearer tokens, private keys) replaced before anything is stored.

Works on serialized JSON bytes, so one regex pass covers every position (messages, tool arguments,
request params, response text, error bodies) and the result is still valid JSON: no pattern matches
a quote or a backslash except inside a private-key block, which is replaced whole. The same
patterns scrub log records (``RedactingFilter``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable

REDACTED = b"[REDACTED]"

# (literal, regex): the regex runs only when its literal occurs (a memchr-speed ``in``), which keeps
# a 50 KB body with no secret at a few microseconds per pattern.
_PATTERNS: list[tuple[bytes, bytes]] = [
    (b"PRIVATE KEY-----",
     rb"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----.{0,20000}?-----END [A-Z ]{0,40}PRIVATE KEY-----"),
    (b"sk-", rb"sk-[A-Za-z0-9_\-]{16,}"),                 # OpenAI, Anthropic (sk-ant-), DeepSeek...
    (b"_pat_", rb"github_pat_[A-Za-z0-9_]{20,}"),
    (b"ghp_", rb"ghp_[A-Za-z0-9]{20,}"), (b"gho_", rb"gho_[A-Za-z0-9]{20,}"),
    (b"ghs_", rb"ghs_[A-Za-z0-9]{20,}"), (b"ghu_", rb"ghu_[A-Za-z0-9]{20,}"),
    (b"xox", rb"xox[abprs]-[A-Za-z0-9\-]{10,}"),         # Slack
    (b"hf_", rb"hf_[A-Za-z0-9]{20,}"),                    # Hugging Face
    (b"AKIA", rb"AKIA[0-9A-Z]{16}"),                      # AWS access key id
    (b"AIza", rb"AIza[0-9A-Za-z_\-]{30,}"),              # Google API key
    (b"glpat-", rb"glpat-[A-Za-z0-9_\-]{16,}"),          # GitLab
    (b"Bearer", rb"Bearer\s+[A-Za-z0-9._~+/=\-]{8,}"),
    (b"bearer", rb"bearer\s+[A-Za-z0-9._~+/=\-]{8,}"),
    (b"BEARER", rb"BEARER\s+[A-Za-z0-9._~+/=\-]{8,}"),
]
# JSON members whose name says they hold a credential: the value goes, whatever it looks like.
_SECRET_KEYS = (
    "api_key", "apiKey", "api-key", "apikey", "x-api-key", "authorization", "Authorization",
    "password", "passwd", "secret", "client_secret", "clientSecret", "access_token", "accessToken",
    "refresh_token", "refreshToken", "auth_token", "authToken", "private_key", "privateKey",
)


class Redactor:
    """Compiled patterns; ``extra`` are more regexes from proxy.redact_patterns (always run)."""

    def __init__(self, extra: Iterable[str] = ()):
        self._rules: list[tuple[bytes | None, re.Pattern[bytes], bytes | Callable]] = []
        for k in _SECRET_KEYS:
            lit = b'"' + k.encode() + b'"'
            rx = re.compile(re.escape(lit) + rb'\s*:\s*"(?:[^"\\]|\\.)*"')
            self._rules.append((lit, rx, lit + b':"' + REDACTED + b'"'))
        for lit, rx in _PATTERNS:
            self._rules.append((lit, re.compile(rx, re.S), REDACTED))
        for p in extra:
            self._rules.append((None, re.compile(p.encode()), REDACTED))

    def bytes(self, data: bytes) -> bytes:
        for lit, rx, repl in self._rules:
            if lit is None or lit in data:
                data = rx.sub(repl, data)
        return data

    def text(self, s: str) -> str:
        return self.bytes(s.encode("utf-8", "surrogateescape")).decode("utf-8", "replace")


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
