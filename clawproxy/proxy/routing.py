"""Who is asking, and which model answers them: users by API key, each with their own LoRA adapter.

Users (clawproxy/users.py): with none in the store and no ``proxy.user_header``, every request is
the one user's (``None``), as before users existed. Otherwise each request must name a user: by
``Authorization: Bearer <key>``, the key's keyed hash looked up in a map of the users table, or by
the ``proxy.user_header`` a trusted front end sets. The map is read every ``POLL_S`` in a thread,
never on the request path.

Adapters: vLLM answers 404 for an adapter's name until the adapter is loaded (``_check_model`` in
``vllm/entrypoints/serve/engine/serving.py``: "The model `clawproxy` does not exist"), and forgets
runtime adapters when it restarts; clawproxy's engine server over llama.cpp answers the same
(``engine/server.py``). So OpenClaw names the base model (the engine's served name), and the
proxy sends each chat request to the adapter that serves its user (``Store.adapter_for``): their
own (``clawproxy-u-<name>``), else the shared one (``clawproxy``) if they share, else the base
model. When the engine answers that the adapter does not exist (it restarted), the proxy loads it
again under that name and retries the request once; if that fails the user gets the base model
until the next publish. Adapter routing is active only for an engine that serves adapters by name
(``EngineSpec.adapters_by_name``: vLLM, llama.cpp) with ``trainer.finetune: lora``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, NamedTuple

import orjson
from aiohttp import web

from clawproxy.config import Config
from clawproxy.errors import ClawproxyError, Unauthorized
from clawproxy.users import adapter_name, key_hash, secret

log = logging.getLogger("clawproxy.proxy.routing")

POLL_S = 1.0
ADAPTER_NAME = adapter_name(None)  # EngineClient's default lora_name: the shared adapter
_FIX = ("ask the operator for a key (`clawproxy users add NAME`), then configure OpenClaw with "
        "`clawproxy openclaw-config --api-key KEY --write`")


class Route(NamedTuple):
    """Where one user's chat requests go: the upstream model name, the adapter directory (None:
    the base model) and the weight version that serves them (0: the base model)."""

    model: str
    path: str | None
    version: int


class ModelRouter:
    """Identifies each request's user and chooses its upstream model (see the module docstring)."""

    def __init__(self, cfg: Config, adapter: str = ADAPTER_NAME):
        self.cfg = cfg
        self.base = cfg.engine.served_name
        self.adapter = adapter
        self.adapters = cfg.engine.spec.adapters_by_name and cfg.trainer.finetune == "lora"
        self.header = cfg.proxy.user_header
        self._base = Route(self.base, None, 0)
        self.routes: dict[str | None, Route] = {}  # user -> route; a user not in it: the base model
        self.keys: dict[str, str] = {}  # key hash -> user name
        self.names: frozenset[str] = frozenset()
        self.has_users = False
        self.secret: bytes | None = None
        self._broken: set[str] = set()  # adapter dirs vLLM would not load again: base until the next publish
        self._lock = asyncio.Lock()
        self._store: Any = None

    @property
    def active(self) -> bool:
        """Whether requests must name a user (there are users, or a header names them)."""
        return self.has_users or self.header is not None

    def identify(self, headers: Mapping[str, str]) -> str | None:
        """The request's user (None: a proxy with no users); ``Unauthorized`` if it names none we know."""
        if self.header is not None:
            name = headers.get(self.header)
            if name is not None and name in self.names:
                return name
            raise Unauthorized(f"no known user in the {self.header} header (proxy.user_header): "
                               "add them with `clawproxy users add NAME`")
        if not self.has_users:
            return None
        scheme, _, key = headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and key.strip() and self.secret is not None:
            name = self.keys.get(key_hash(self.secret, key.strip()))
            if name is not None:
                return name
            raise Unauthorized(f"this API key is not known to clawproxy; {_FIX}")
        raise Unauthorized(f"this proxy has users: send your key as `Authorization: Bearer <key>`; {_FIX}")

    def target(self, user: str | None = None) -> Route:
        return self.routes.get(user, self._base) if self.adapters else self._base

    def _ours(self, model: Any) -> bool:
        """A model name the router may replace: none, the base, or any of our adapters' names (a
        user never reaches another's adapter by naming it)."""
        return model is None or model == self.base or (isinstance(model, str) and (
            model == self.adapter or model.startswith(adapter_name("", self.adapter))))

    def route(self, obj: dict[str, Any], body: bytes, user: str | None = None) -> tuple[bytes, Route | None]:
        """``body`` with its model set to ``user``'s target when it names ours, and that target
        (None: the body names another model and goes as it is)."""
        requested = obj.get("model")
        if not self.adapters or not self._ours(requested):
            return body, None
        target = self.target(user)
        if requested == target.model:
            return body, target
        return orjson.dumps({**obj, "model": target.model}), target

    def guard(self, body: bytes, user: str) -> bytes:
        """A request other than chat (completions, responses) that names one of our adapters goes
        to ``user``'s target: nobody reaches another user's adapter by its name."""
        if not self.adapters or self.adapter.encode() not in body:
            return body
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        if not isinstance(obj, dict) or obj.get("model") in (None, self.base) or not self._ours(obj.get("model")):
            return body
        return self.route(obj, body, user)[0]

    def visible_models(self, data: bytes, user: str) -> bytes:
        """vLLM's model list as ``user`` may see it: other users' adapters (whose names are user
        names) and the shared one, unless it serves them, are left out."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
            return data
        mine = {self.base, self.target(user).model}
        kept = [m for m in obj["data"] if not (isinstance(m, dict) and self._ours(m.get("id"))
                                                and m.get("id") not in mine)]
        return orjson.dumps({**obj, "data": kept})

    def lost(self, status: int, data: bytes, target: Route | None) -> bool:
        """vLLM's 404 for the adapter's name: it restarted and lost the adapter."""
        return (status == 404 and target is not None and target.path is not None
                and b"does not exist" in data and f"`{target.model}`".encode() in data)

    async def recover(self, body: bytes, user: str | None, lost: Route) -> tuple[bytes, Route | None]:
        """Load the lost adapter again (one request does it, the others wait for it); return
        ``body`` routed again: to the adapter, or to the base model if the load failed."""
        async with self._lock:
            if lost.path is not None and self.target(user) == lost:
                try:
                    await asyncio.to_thread(self._client().load_adapter, lost.path, lost.model)
                    log.info("vLLM had lost adapter %r; loaded %s again", lost.model, lost.path)
                except ClawproxyError as e:
                    log.warning("could not load adapter %s again (%s); serving the base model "
                                "until the next publish", lost.path, e.message)
                    self._broken.add(lost.path)
                    self.routes = {u: self._base if r.path == lost.path else r for u, r in self.routes.items()}
        return self.route(orjson.loads(body), body, user)

    def _client(self) -> Any:
        from clawproxy.engine.client import EngineClient

        return EngineClient(self.cfg.engine_url, kind=self.cfg.engine.kind, token=self.cfg.engine.control_token)

    def _route(self, row: dict[str, Any] | None, name: str) -> Route:
        if row is None:
            return self._base
        if row["format"] != "lora":  # a full checkpoint is the base model's own weights
            return Route(self.base, None, int(row["version"]))
        if row["path"] in self._broken:
            return self._base
        return Route(name, row["path"], int(row["version"]))

    def refresh(self) -> None:
        """Read the users and who is served what from the store (a thread: SQLite blocks);
        the same choice as ``Store.adapter_for``, with one read of the shared adapter."""
        from clawproxy.store import Store

        if self._store is None:
            self._store = Store(self.cfg.db_path)
        store = self._store
        users = store.user_keys()
        if users and self.secret is None:
            self.secret = secret(self.cfg.data_path)
        shared = self._route(store.serving_checkpoint(), self.adapter)
        routes: dict[str | None, Route] = {None: shared}
        for u in users:
            own = store.serving_checkpoint(u["name"])
            routes[u["name"]] = (self._route(own, adapter_name(u["name"], self.adapter)) if own is not None
                                 else shared if u["shared"] else self._base)
        current = {r.path for r in routes.values()}
        self._broken &= current  # a new publish replaces a broken adapter
        # Routes before keys: a user whose key is already known is never sent to a stale route.
        self.routes = routes
        self.names = frozenset(u["name"] for u in users)
        self.keys = {u["key_hash"]: u["name"] for u in users if u["key_hash"]}
        self.has_users = bool(users)

    async def _poll(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.refresh)
            except Exception:  # a store hiccup must not end routing; the next poll tries again
                log.exception("model router: reading the users and published adapters failed")
            await asyncio.sleep(POLL_S)

    async def ctx(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx: read once before serving, then poll in a named task owned here."""
        try:
            await asyncio.to_thread(self.refresh)
        except Exception:  # a broken store must not stop the serving: the base model until it reads
            log.exception("model router: reading the users and published adapters failed; "
                          "serving the base model")
            # A data dir that has had users refuses every key until the store reads: never open
            self.has_users = await asyncio.to_thread(secret, self.cfg.data_path) is not None
        task = asyncio.create_task(self._poll(), name="clawproxy-model-router")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self._store is not None:
            self._store.close()


def router_for(cfg: Config) -> ModelRouter:
    """The router: users always (the store may get some while serving); adapters when the
    upstream serves the trainer's LoRA adapters by name."""
    return ModelRouter(cfg)
