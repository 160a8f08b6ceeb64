"""The exception tree of clawproxy.

    ClawproxyError                 base of everything we raise on purpose
    ├── ConfigError                a config file or flag is wrong; the message says how to fix it
    ├── StoreError                 the SQLite store cannot be opened, migrated or written
    ├── UpstreamError              the model server failed or is unreachable (502)
    │   ├── UpstreamUnavailable    ... is starting or restarting: retry shortly (503, Retry-After)
    │   └── UpstreamTimeout        ... or did not answer in time (504)
    ├── EngineError                the embedded engine refused a control verb (e.g. a bad checkpoint)
    └── RequestError               the client's request is invalid (status is 4xx)
        ├── Unauthorized           no valid bearer token (401)
        ├── Forbidden              a control route asked from off loopback with no token set (403)
        └── NotFound               no such route (404)

Both servers answer these as JSON errors through ``clawproxy.edge.error_response`` (the shape is
``error_body``); the CLI maps them to ``click.ClickException`` with a one-line fix.
"""

from __future__ import annotations

from typing import Any


class ClawproxyError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None
    retry_after: int | None = None  # seconds, sent as Retry-After

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
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


class UpstreamUnavailable(UpstreamError):
    status = 503
    type = "upstream_unavailable"
    retry_after = 1


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "upstream_timeout"


class EngineError(ClawproxyError):
    status = 400
    type = "engine_error"


class RequestError(ClawproxyError):
    status = 400
    type = "invalid_request_error"


class Unauthorized(RequestError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(RequestError):
    status = 403
    type = "permission_error"


class NotFound(RequestError):
    status = 404
    type = "not_found_error"
    code = "not_found"


# vLLM names the error type after openai-python's exception for the status, and puts the status in code.
VLLM_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
              404: "NotFoundError", 409: "ConflictError", 422: "UnprocessableEntityError",
              429: "RateLimitError"}


def error_body(err: ClawproxyError, *, vllm: bool = False) -> dict[str, Any]:
    """The JSON error OpenAI clients (and OpenClaw) parse: ``{"error": {message, type, param, code}}``.

    ``vllm``: the dialect vLLM's server speaks (and so our engine): the same keys, with ``type`` the
    openai-python exception name and ``code`` the HTTP status.
    """
    if vllm:
        type_ = VLLM_TYPES.get(err.status, "InternalServerError" if err.status >= 500 else "BadRequestError")
        return {"error": {"message": err.message, "type": type_, "param": err.param, "code": err.status}}
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}
