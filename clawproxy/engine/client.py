"""EngineClient: one synchronous client for the control verbs of both engines.

The trainer (and the CLI) drive weight updates through this class whether the upstream is our
embedded engine or a vLLM server, so the CPU path exercises the same sequence a GPU deployment
runs: pause in ``keep`` mode, reload from a checkpoint directory, reset the prefix cache, resume.

It uses only the standard library (``urllib``) and never imports torch: the proxy path and the
CLI must stay light.

Routes, as followed from vLLM's dev-mode server (``VLLM_SERVER_DEV_MODE=1``;
``vllm/entrypoints/serve/dev/rlhf/api_router.py``, ``.../dev/rpc/api_router.py``,
``.../lora/api_router.py`` in vllm-project/vllm):

==================  ===============================================  ==============================
verb                vLLM                                              embedded engine
==================  ===============================================  ==============================
health              ``GET /health`` (200, empty body)                 same (JSON body)
pause               ``POST /pause?mode=keep|wait|abort``              same
resume              ``POST /resume``                                  same
is_paused           ``GET /is_paused`` -> ``{"is_paused": bool}``     same
reload (full)       ``POST /collective_rpc`` with                     ``POST /reload_weights``
                    ``{"method": "reload_weights",                    ``{"weights_path", "weight_version"}``
                    "kwargs": {"weights_path": dir}}``                (``/collective_rpc`` too)
reload (LoRA)       ``POST /v1/load_lora_adapter``                    same, plus ``weight_version``
                    ``{"lora_name", "lora_path", "load_inplace"}``
reset prefix cache  ``POST /reset_prefix_cache``                      same (a no-op there)
weight version      none: this client keeps the counter               ``GET /weight_info``
==================  ===============================================  ==============================

vLLM keeps no integer weight version, so for ``kind="vllm"`` the client holds it
(``initial_version``, then whatever ``load_weights`` was given last). With a LoRA adapter on vLLM,
requests must name the adapter (``lora_name``, default ``"clawproxy"``) as their ``model`` to use
it; ``load_inplace`` replaces it under the same name on each update.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Literal

from clawproxy.errors import EngineError

PauseMode = Literal["keep", "wait", "abort"]
# The engine is ours to reach directly, like the proxy does (aiohttp ignores proxy variables):
# urlopen would send even 127.0.0.1 through $http_proxy unless $no_proxy lists it.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EngineClient:
    """Drive an engine's control plane over HTTP (sync; call it from a thread, not an event loop).

    Args:
        base_url: The engine's root URL, e.g. ``http://127.0.0.1:8081`` (a trailing ``/v1`` is
            tolerated and stripped: control routes live at the root on both engines).
        kind: ``"embedded"`` for our engine, ``"vllm"`` for a ``vllm serve`` in dev mode.
        token: Bearer token sent with every request (the embedded engine's ``--control-token``,
            or vLLM's ``--api-key``).
        timeout: Seconds to wait for ordinary control verbs.
        reload_timeout: Seconds to wait for a weight reload (large checkpoints take a while).
        initial_version: Starting weight version for ``kind="vllm"`` (vLLM keeps none).
        lora_name: Adapter name used with vLLM's ``/v1/load_lora_adapter``.
    """

    def __init__(
        self,
        base_url: str,
        kind: Literal["embedded", "vllm"] = "embedded",
        token: str | None = None,
        timeout: float = 30.0,
        *,
        reload_timeout: float = 600.0,
        initial_version: int = 0,
        lora_name: str = "clawproxy",
    ) -> None:
        if kind not in ("embedded", "vllm"):
            raise ValueError(f"kind={kind!r}: use 'embedded' or 'vllm'")
        url = base_url.rstrip("/")
        if url.endswith("/v1"):
            url = url[: -len("/v1")]
        self.base_url = url
        self.kind = kind
        self.token = token
        self.timeout = timeout
        self.reload_timeout = reload_timeout
        self.lora_name = lora_name
        self._version = int(initial_version)

    # -- plumbing ---------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        query: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Send one request; return the decoded JSON body (None when empty); raise EngineError."""
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with _OPENER.open(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raw = err.read()
            raise EngineError(
                f"{method} {path} refused ({err.code}): {_error_message(raw) or err.reason}",
                status=err.code,
            ) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise EngineError(
                f"{method} {path}: engine at {self.base_url} unreachable: {reason}", status=503
            ) from None
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    # -- verbs ------------------------------------------------------------------------------

    def served_model_card(self) -> dict[str, Any]:
        """The first model card ``GET /v1/models`` lists (vLLM: the served model, with max_model_len)."""
        cards = self._request("GET", "/v1/models")
        try:
            card = cards["data"][0]
            str(card["id"])
        except (TypeError, KeyError, IndexError) as err:
            raise EngineError(f"GET /v1/models at {self.base_url}: no model listed ({err!r})", status=502) from None
        return card

    def served_model(self) -> str:
        """The first model id ``GET /v1/models`` lists (vLLM: the served model)."""
        return str(self.served_model_card()["id"])

    def health(self) -> bool:
        """True when the engine answers ``GET /health`` with 200 (never raises)."""
        try:
            self._request("GET", "/health", timeout=min(self.timeout, 5.0))
        except EngineError:
            return False
        return True

    def pause(self, mode: PauseMode = "keep") -> None:
        """Pause generation. keep: in-flight requests freeze and continue after resume;
        wait: drain in-flight requests first; abort: end them now."""
        if mode not in ("keep", "wait", "abort"):
            raise ValueError(f"mode={mode!r}: use keep, wait or abort")
        self._request("POST", "/pause", query={"mode": mode}, timeout=self.reload_timeout)

    def resume(self) -> None:
        """Resume generation after ``pause``."""
        self._request("POST", "/resume")

    def is_paused(self) -> bool:
        body = self._request("GET", "/is_paused")
        return bool(body["is_paused"]) if isinstance(body, dict) else False

    def reset_prefix_cache(self) -> None:
        self._request("POST", "/reset_prefix_cache")

    def weight_version(self) -> int:
        """The weight version now serving (vLLM: the one this client last loaded)."""
        if self.kind == "vllm":
            return self._version
        body = self._request("GET", "/weight_info")
        return int(body["weight_version"])

    def load_weights(self, path: str, version: int, lora: bool = False) -> int:
        """Swap in the checkpoint at ``path`` as weight version ``version``; return the version.

        Sequence: pause (keep) -> reload -> reset prefix cache -> resume. Resume always runs,
        even when the pause itself failed, so a refused checkpoint leaves the engine serving its
        old weights, unpaused. Raises
        EngineError with the server's message when the reload is refused.
        """
        path = str(path)
        version = int(version)
        try:
            # inside the try: a pause whose answer is lost (timeout, dropped connection) may
            # still have paused the engine, and nothing else would ever resume it
            self.pause("keep")
            if lora:
                body: dict[str, Any] = {
                    "lora_name": self.lora_name,
                    "lora_path": path,
                    "load_inplace": True,
                }
                if self.kind == "embedded":
                    body["weight_version"] = version
                self._request("POST", "/v1/load_lora_adapter", body, timeout=self.reload_timeout)
            elif self.kind == "vllm":
                self._request(
                    "POST",
                    "/collective_rpc",
                    {"method": "reload_weights", "kwargs": {"weights_path": path}},
                    timeout=self.reload_timeout,
                )
            else:
                self._request(
                    "POST",
                    "/reload_weights",
                    {"weights_path": path, "weight_version": version},
                    timeout=self.reload_timeout,
                )
            self.reset_prefix_cache()
        finally:
            self.resume()
        if self.kind == "vllm":
            self._version = version
            return version
        return self.weight_version()


def _error_message(raw: bytes) -> str:
    """Pull the human message out of any error shape the two engines use.

    OpenAI/vLLM ``{"error": {"message": ...}}``, vLLM dev routes ``{"error": "..."}``, FastAPI
    ``{"detail": ...}``, older vLLM ``{"object": "error", "message": ...}``.
    """
    text = raw.decode(errors="replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("detail") is not None:
            return str(body["detail"])
        if body.get("message"):
            return str(body["message"])
    return text[:500]
