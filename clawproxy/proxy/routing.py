"""Who is asking, and which model answers them: users by API key, each with their own LoRA adapter.

Users (clawproxy/users.py): with none in the store and no ``proxy.user_header``, every request is
the one user's (``None``), as before users existed. Otherwise each request must name a user: by
``Authorization: Bearer <key>``, the key's keyed hash looked up in a map of the users table, or by
the ``proxy.user_header`` a trusted front end sets. The map is read by the proxy's poller
(``poller.py``), never on the request path.

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

This is the one process that loads a lost adapter again: it sees the 404 first, on the request that
needs the adapter, and runs whether or not the trainer does; the trainer only reports an adapter it
finds lost (``trainer/checkpoints.py``'s ``ensure_engine_serves``).

The router is an addon (``tap.py``'s hooks): ``identify`` the caller, ``rewrite`` the model a
request names, ``retry`` once after a lost adapter, ``reply`` with the model list a user may see.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from clawproxy.config import Config
from clawproxy.errors import ClawproxyError, Unauthorized
from clawproxy.proxy.tap import Caller
from clawproxy.proxy.wire import Outgoing
from clawproxy.users import adapter_name, key_hash, secret

if TYPE_CHECKING:
    from clawproxy.store import Store

log = logging.getLogger("clawproxy.proxy.routing")

ADAPTER_NAME = adapter_name(None)  # EngineClient's default lora_name: the shared adapter
_CONTROL = "this proxy needs `Authorization: Bearer <proxy.control_token>`"
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

    @property
    def active(self) -> bool:
        """Whether requests must name a user (there are users, or a header names them)."""
        return self.has_users or self.header is not None

    def identify(self, headers: Mapping[str, str], control_ok: bool) -> Caller | None:
        """The addon hook: the request's user when requests must name one (None: they need not);
        ``Unauthorized`` if it names none we know. A user's key authenticates as well as the control
        token; a front end's header does not."""
        if not self.active:
            return None
        if self.header is not None:
            if not control_ok:
                raise Unauthorized(_CONTROL)
            name = headers.get(self.header)
            if name is not None and name in self.names:
                return Caller(name)
            raise Unauthorized(f"no known user in the {self.header} header (proxy.user_header): "
                               "add them with `clawproxy users add NAME`")
        scheme, _, key = headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and key.strip() and self.secret is not None:
            name = self.keys.get(key_hash(self.secret, key.strip()))
            if name is not None:
                return Caller(name)
            raise Unauthorized(f"this API key is not known to clawproxy; {_FIX}")
        raise Unauthorized(f"this proxy has users: send your key as `Authorization: Bearer <key>`; {_FIX}")

    def target(self, user: str | None = None) -> Route:
        return self.routes.get(user, self._base) if self.adapters else self._base

    def _ours(self, model: Any) -> bool:
        """A model name the router may replace: none, the base, or any of our adapters' names (a
        user never reaches another's adapter by naming it)."""
        return model is None or model == self.base or (isinstance(model, str) and (
            model == self.adapter or model.startswith(adapter_name("", self.adapter))))

    def rewrite(self, req: Outgoing) -> None:
        """The addon hook: a named caller's key is replaced by the engine's token upstream; a chat request naming ours goes to its user's target, and another request naming one of our
        adapters to its user's (nobody reaches another user's adapter by its name)."""
        if self.active:
            req.upstream_token = self.cfg.engine.control_token
        if req.chat:
            self._route(req)
        elif req.user is not None and req.raw and req.method == "POST" and self._names_adapter(req):
            self._route(req)

    def _names_adapter(self, req: Outgoing) -> bool:
        if not self.adapters or self.adapter.encode() not in req.raw:
            return False  # the bytes do not name it: the body stays unparsed
        obj = req.json()
        return obj is not None and obj.get("model") not in (None, self.base) and self._ours(obj.get("model"))

    def _route(self, req: Outgoing) -> None:
        """``req`` with its model set to its user's target when it names ours (the target noted for
        ``retry``); one naming another model goes as it is."""
        obj = req.json()
        assert obj is not None
        requested = obj.get("model")
        if not self.adapters or not self._ours(requested):
            req.notes["route"] = None
            req.routed_version = None
            return
        target = self.target(req.user)
        req.notes["route"] = target
        req.routed_version = target.version
        if requested != target.model:
            req.set("model", target.model)

    def reply(self, req: Outgoing, status: int, data: bytes) -> bytes:
        """The addon hook: vLLM's model list as the user may see it: other users' adapters (whose
        names are user names) and the shared one, unless it serves them, are left out."""
        if req.chat or req.user is None or status != 200 or req.method != "GET" or req.path != "/v1/models":
            return data
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
        if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
            return data
        mine = {self.base, self.target(req.user).model}
        kept = [m for m in obj["data"] if not (isinstance(m, dict) and self._ours(m.get("id"))
                                                and m.get("id") not in mine)]
        return orjson.dumps({**obj, "data": kept})

    def lost(self, status: int, data: bytes, target: Route | None) -> bool:
        """vLLM's 404 for the adapter's name: it restarted and lost the adapter."""
        return (status == 404 and target is not None and target.path is not None
                and b"does not exist" in data and f"`{target.model}`".encode() in data)

    async def retry(self, req: Outgoing, status: int, data: bytes) -> bool:
        """The addon hook: after vLLM's 404 for a lost adapter, load it again and route the
        request again (once): to the adapter, or to the base model if the load failed."""
        lost: Route | None = req.notes.get("route")
        if not req.chat or "rerouted" in req.notes or lost is None or not self.lost(status, data, lost):
            return False
        req.notes["rerouted"] = True
        await self.recover(req.user, lost)
        self._route(req)
        return True

    async def recover(self, user: str | None, lost: Route) -> None:
        """Load the lost adapter again (one request does it, the others wait for it); a failed
        load sends its users to the base model until the next publish."""
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

    def _client(self) -> Any:
        from clawproxy.engine.client import EngineClient

        return EngineClient(self.cfg.engine_url, kind=self.cfg.engine.kind, token=self.cfg.engine.control_token)

    def _route_of(self, row: dict[str, Any] | None, name: str) -> Route:
        if row is None:
            return self._base
        if row["format"] != "lora":  # a full checkpoint is the base model's own weights
            return Route(self.base, None, int(row["version"]))
        if row["path"] in self._broken:
            return self._base
        return Route(name, row["path"], int(row["version"]))

    def read(self, store: Store) -> None:
        """The poller's read (a thread: SQLite blocks): the users and who is served what; the same
        choice as ``Store.adapter_for``, with one read of the shared adapter."""
        users = store.user_keys()
        if users and self.secret is None:
            self.secret = secret(self.cfg.data_path)
        shared = self._route_of(store.serving_checkpoint(), self.adapter)
        routes: dict[str | None, Route] = {None: shared}
        for u in users:
            own = store.serving_checkpoint(u["name"])
            routes[u["name"]] = (self._route_of(own, adapter_name(u["name"], self.adapter)) if own is not None
                                 else shared if u["shared"] else self._base)
        current = {r.path for r in routes.values()}
        self._broken &= current  # a new publish replaces a broken adapter
        # Routes before keys: a user whose key is already known is never sent to a stale route.
        self.routes = routes
        self.names = frozenset(u["name"] for u in users)
        self.keys = {u["key_hash"]: u["name"] for u in users if u["key_hash"]}
        self.has_users = bool(users)

    def unreadable(self) -> None:
        """The poller could not read the store before serving: the base model until it reads. A
        data dir that has had users refuses every key until then: never open."""
        self.has_users = secret(self.cfg.data_path) is not None


def router_for(cfg: Config) -> ModelRouter:
    """The router: users always (the store may get some while serving); adapters when the
    upstream serves the trainer's LoRA adapters by name."""
    return ModelRouter(cfg)
