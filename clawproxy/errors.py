"""The exception tree of clawproxy.

    ClawproxyError                 base of everything we raise on purpose
    ├── ConfigError                a config file or flag is wrong; the message says how to fix it
    ├── StoreError                 the SQLite store cannot be opened, migrated or written
    ├── UpstreamError              the model server failed (status is the HTTP status to return)
    │   └── UpstreamTimeout        ... or did not answer in time (504)
    ├── EngineError                the embedded engine refused a control verb (e.g. a bad checkpoint)
    └── RequestError               the client's request is invalid (status is 4xx)

The proxy maps these to OpenAI-style JSON errors (``openai_error_body``); the CLI maps them to
``click.ClickException`` with a one-line fix.
"""

from __future__ import annotations


class ClawproxyError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class ConfigError(ClawproxyError):
    type = "config_error"


class StoreError(ClawproxyError):
    type = "store_error"


class UpstreamError(ClawproxyError):
    status = 502
    type = "upstream_error"


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "upstream_timeout"


class EngineError(ClawproxyError):
    status = 400
    type = "engine_error"


class RequestError(ClawproxyError):
    status = 400
    type = "invalid_request_error"


def openai_error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict:
    """The JSON error shape OpenAI clients (and OpenClaw) parse."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
