"""EngineClient: one synchronous client for the control verbs of both engines.

The trainer (and the CLI) drive weight updates through this class whether the upstream is our
embedded engine or a vLLM server, so the CPU path exercises the same sequence a GPU deployment
runs: pause in ``keep`` mode, reload from a checkpoint directory, reset the prefix cache, resume.

It speaks JSON over HTTP through ``clawproxy/httpjson.py`` (standard library only) and never imports
torch: the proxy path and the CLI must stay light.

Routes, as read in the vLLM 0.33.0 wheel (``vllm/entrypoints/...``); vLLM >= 0.16.0 is required
(``MIN_VLLM``): 0.15 has no ``keep`` pause and its ``reload_weights`` takes no path.

==================  ===============================================  ==============================
verb                vLLM (route needs)                                clawproxy's engine server
==================  ===============================================  ==============================
version             ``GET /version`` -> ``{"version": "0.33.0"}``     none (not checked)
health              ``GET /health`` (200, empty body)                 same (JSON body)
pause               ``POST /pause?mode=keep`` (dev mode)              same
resume              ``POST /resume`` (dev mode)                       same
is_paused           ``GET /is_paused`` (dev mode)                     same
reload (full)       ``POST /collective_rpc`` (dev mode)               ``POST /reload_weights``
                    ``{"method": "reload_weights",                    ``{"weights_path", "weight_version"}``
                    "kwargs": {"weights_path": dir}}``
reload (LoRA)       ``POST /v1/load_lora_adapter``                    same, plus ``weight_version``
                    (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``)          (llamacpp: by name, as vLLM;
                                                                      embedded: merged, name unused)
unload (LoRA)       ``POST /v1/unload_lora_adapter``                  llamacpp: same; embedded: 404
reset prefix cache  ``POST /reset_prefix_cache`` (dev mode);          same (a no-op there)
                    0.33 answers ``{"success": false}`` while
                    requests hold blocks
weight version      ``GET /weight_info``, ``POST                      ``GET /weight_info``
                    /update_weight_version`` (dev mode, newer vLLM)
==================  ===============================================  ==============================

Dev mode is ``VLLM_SERVER_DEV_MODE=1`` (``launchers/api_server/routers.py``); the LoRA routes are
only registered with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` (``serve/lora/api_router.py``).
``check_vllm`` verifies all of it at attach time.

A vLLM without ``/weight_info`` keeps no weight version, so the client holds it
(``initial_version``, then whatever ``load_weights`` was given last). A LoRA adapter is loaded under
``lora_name`` (default ``"clawproxy"``); the proxy routes requests to it (``proxy/routing.py``).

A full reload is not atomic in vLLM: ``model_loader/reload/`` moves layers to the meta device
before reading the new weights, and nothing puts them back if reading fails. Callers validate a
checkpoint before asking for it and reload the last good one after any failure
(``trainer/checkpoints.py: publish``).
"""

from __future__ import annotations

import itertools
from typing import Any, Literal, Protocol

from clawproxy.engine_spec import EngineSpec, engine_spec
from clawproxy.errors import EngineError
from clawproxy.httpjson import request_json, strip_v1

PauseMode = Literal["keep", "wait", "abort"]
MIN_VLLM = (0, 16, 0)
# statuses that say "try again later", not "this checkpoint is bad" (502/504: a proxy in between)
TRANSIENT = frozenset({502, 503, 504})


class Engine(Protocol):
    """What the trainer calls on an engine (``trainer/``): ``EngineClient`` meets it."""

    base_url: str
    lora_name: str  # the shared adapter's name; a user's adapter is named after it (``clawproxy.users``)

    @property
    def spec(self) -> EngineSpec: ...
    def health(self) -> bool: ...
    def weight_version(self) -> int: ...
    def served_adapters(self) -> dict[str, str]: ...
    def load_weights(self, path: str, version: int, lora: bool = False, name: str | None = None) -> int: ...


class EngineClient:
    """Drive an engine's control plane over HTTP (sync; call it from a thread, not an event loop).

    Args:
        base_url: The engine's root URL, e.g. ``http://127.0.0.1:8081`` (a trailing ``/v1`` is
            tolerated and stripped: control routes live at the root on both engines).
        kind: ``engine.kind``: ``"vllm"`` for a ``vllm serve`` in dev mode, ``"embedded"`` or
            ``"llamacpp"`` for clawproxy's engine server.
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
        kind: str = "embedded",
        token: str | None = None,
        timeout: float = 30.0,
        *,
        reload_timeout: float = 600.0,
        initial_version: int = 0,
        lora_name: str = "clawproxy",
    ) -> None:
        engine_spec(kind)  # ValueError names the kinds
        self.base_url = strip_v1(base_url)
        self.kind = kind
        self.token = token
        self.timeout = timeout
        self.reload_timeout = reload_timeout
        self.lora_name = lora_name
        self._version = int(initial_version)
        self._has_weight_info: bool | None = None  # vLLM: probed on first use
        self._routes: set[str] | None = None  # vLLM: the paths its /openapi.json lists

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
        return request_json(method, self.base_url + path, body, token=self.token,
                            timeout=timeout or self.timeout, query=query, error=EngineError)

    @property
    def spec(self) -> EngineSpec:
        """What this engine can do (``clawproxy/engine_spec.py``): callers ask it, not ``kind``."""
        return engine_spec(self.kind)

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

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache; True when it is empty afterwards.

        vLLM 0.33 answers ``{"success": false}`` while running requests hold blocks (the frozen
        ones of a keep pause); those blocks hold KV of the old weights and would be cached on
        finish, so the second try preempts them (``reset_running_requests=true``): they recompute
        with the new weights. Older servers answer an empty 200 (success unknown, taken as done)."""
        body = self._request("POST", "/reset_prefix_cache")
        if not isinstance(body, dict) or body.get("success", True):
            return True
        body = self._request("POST", "/reset_prefix_cache", query={"reset_running_requests": "true"})
        return not isinstance(body, dict) or bool(body.get("success", True))

    def version(self) -> tuple[int, ...] | None:
        """vLLM's ``GET /version`` as a tuple (``(0, 33, 0)``); None when the server has no such route."""
        try:
            body = self._request("GET", "/version")
        except EngineError as e:
            if e.status == 404:
                return None
            raise
        return _version_tuple(str(body.get("version", ""))) if isinstance(body, dict) else None

    def check_vllm(self, lora: bool) -> None:
        """Check an attached ``vllm serve`` can do what the trainer will ask; raise EngineError
        with one line that says what to change (version, dev mode, runtime LoRA routes)."""
        ver = self.version()
        if ver is None:
            raise EngineError(f"{self.base_url} is not a vLLM (no /version), and the trainer publishes weights "
                              f"through vLLM's control routes", status=400)
        if ver < MIN_VLLM:
            have = ".".join(map(str, ver)) if ver else "unknown"
            need = ".".join(map(str, MIN_VLLM))
            raise EngineError(f"vLLM at {self.base_url} is {have}; clawproxy needs vllm>={need} "
                              f"(pause keep + reload_weights from a path): pip install 'vllm>={need}'", status=400)
        if not self._route_exists("GET", "/is_paused"):
            raise EngineError(f"vLLM at {self.base_url} has no /pause or /is_paused: start it with "
                              "VLLM_SERVER_DEV_MODE=1 (see configs/gpu-1.yaml)", status=400)
        if lora and not self._route_exists("POST", "/v1/load_lora_adapter", {}):
            raise EngineError(f"vLLM at {self.base_url} has no /v1/load_lora_adapter: start it with "
                              "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 and --enable-lora (see configs/gpu-1.yaml)",
                              status=400)

    def check(self, lora: bool) -> None:
        """Check the engine can do what the trainer will ask: ``check_vllm`` where the spec says its
        control plane needs checking (the embedded engine's is ours, always there)."""
        if self.spec.checks_control_plane:
            self.check_vllm(lora)

    def _route_exists(self, method: str, path: str, body: dict[str, Any] | None = None) -> bool:
        """Whether the server registered the route: read from its OpenAPI schema (FastAPI serves
        ``/openapi.json``), else probed: only the framework's own 404 (``{"detail": "Not Found"}``)
        means no such route; a handler's answer, even an error, means it is served. The schema
        comes first because vLLM logs a 20-line traceback for every refused probe."""
        if self._routes is None:
            try:
                schema = self._request("GET", "/openapi.json")
                self._routes = set(schema["paths"]) if isinstance(schema, dict) else set()
            except (EngineError, KeyError, TypeError):
                self._routes = set()
        if self._routes:
            return path in self._routes
        try:
            self._request(method, path, body)
        except EngineError as e:
            return not (e.status == 404 and e.message.endswith(": Not Found"))
        return True

    def weight_version(self) -> int:
        """The weight version now serving. vLLM: ``GET /weight_info`` where the server has it (a
        server started fresh reports ``"default"``, the base model: 0), else the version this
        client loaded last."""
        if not self.spec.vllm_routes:
            body = self._request("GET", "/weight_info")
            return int(body["weight_version"])
        body = self._weight_route("GET", "/weight_info")
        if self._has_weight_info:
            raw = str((body or {}).get("weight_version"))
            return int(raw) if raw.isdigit() else 0
        return self._version

    def served_adapters(self) -> dict[str, str]:
        """LoRA adapters the server lists in ``GET /v1/models``: name -> path (the card's ``root``)."""
        cards = self._request("GET", "/v1/models")
        return {str(c["id"]): str(c.get("root")) for c in (cards or {}).get("data", [])
                if isinstance(c, dict) and c.get("parent")}

    def load_adapter(self, path: str, name: str | None = None) -> None:
        """``POST /v1/load_lora_adapter`` under ``name`` (default ``lora_name``), in place (no
        pause: a request that names the adapter before it exists gets a 404, which the proxy handles)."""
        body = {"lora_name": name or self.lora_name, "lora_path": str(path), "load_inplace": True}
        self._request("POST", "/v1/load_lora_adapter", body, timeout=self.reload_timeout)

    def unload_adapter(self, name: str) -> None:
        """``POST /v1/unload_lora_adapter``: the engine forgets the adapter ``name`` (404 if it has none)."""
        self._request("POST", "/v1/unload_lora_adapter", {"lora_name": name}, timeout=self.reload_timeout)

    def load_weights(self, path: str, version: int, lora: bool = False, name: str | None = None) -> int:
        """Swap in the checkpoint at ``path`` as weight version ``version``; return the version. A LoRA
        adapter is loaded under ``name`` (default ``lora_name``).

        Sequence: pause (keep) -> reload -> reset prefix cache -> (vLLM) update_weight_version
        -> resume. Resume always runs, even when the pause itself failed. A failed reload raises
        EngineError with the server's message; on vLLM a failed *full* reload leaves the engine
        without usable weights (see the module docstring): the caller reloads the last good
        version.
        """
        path = str(path)
        version = int(version)
        try:
            # inside the try: a pause whose answer is lost (timeout, dropped connection) may
            # still have paused the engine, and nothing else would ever resume it
            self.pause("keep")
            if lora:
                body: dict[str, Any] = {
                    "lora_name": name or self.lora_name,
                    "lora_path": path,
                    "load_inplace": True,
                }
                if not self.spec.vllm_routes:
                    body["weight_version"] = version
                self._request("POST", "/v1/load_lora_adapter", body, timeout=self.reload_timeout)
            elif self.spec.vllm_routes:
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
            if not self.reset_prefix_cache():
                raise EngineError(f"POST /reset_prefix_cache at {self.base_url}: the prefix cache "
                                  "could not be reset; cached blocks of the old weights may be reused",
                                  status=500)
            if self.spec.vllm_routes:
                self._version = version
                self._set_vllm_version(version)
        finally:
            self.resume()
        if self.spec.vllm_routes:
            return version
        return self.weight_version()

    def _set_vllm_version(self, version: int) -> None:
        """Tell a vLLM that has ``/update_weight_version`` which version it serves now."""
        self._weight_route("POST", "/update_weight_version", {"new_version": str(version)})

    def _weight_route(self, method: str, path: str, body: Any = None) -> Any:
        """A vLLM weight-version route (0.33 has them): its answer, or None, and never asked
        again, where this server answers 404."""
        if self._has_weight_info is False:
            return None
        try:
            out = self._request(method, path, body)
        except EngineError as e:
            if e.status != 404:
                raise
            self._has_weight_info = False
            return None
        self._has_weight_info = True
        return out


def _version_tuple(text: str) -> tuple[int, ...] | None:
    """``"0.33.0"`` / ``"0.16.0rc1.dev12+g..."`` -> ``(0, 33, 0)`` / ``(0, 16, 0)``."""
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(itertools.takewhile(str.isdigit, piece))
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) if parts else None
