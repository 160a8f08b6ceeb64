"""Checkpoints on disk and in the store: atomic writes, the current version, pruning, rollback.

Layout: ``<data_dir>/checkpoints/v<N>/`` holds a Hugging Face model directory (``model.safetensors``
+ ``config.json`` + tokenizer files) or a PEFT adapter directory (``adapter_model.safetensors`` +
``adapter_config.json``). Version 0 is the engine's starting model (``engine.model`` resolved with
``resolve_model``); it has no row and is never deleted.

The ``checkpoints`` table is the source of truth for "what is serving": the current version is the
highest ``published`` row of an owner's adapter (``user`` NULL: the shared adapter, the only one with
no users; a user's adapter is served under ``clawproxy.users.adapter_name``). Versions are one
sequence over all owners, so ``v<N>`` directories never collide. A rollback publishes a *new* version number whose row points at the old
directory, so versions only grow (staleness arithmetic stays valid) and the history shows the
rollback as its own step.

Publishing (``publish``) validates a checkpoint completely before the engine sees it, because a
failed full reload is not atomic in vLLM (``model_executor/model_loader/reload/`` moves the layers
to the meta device first and restores nothing when reading fails): after any failed reload the
last good version is loaded again.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawproxy.convert import write_dir_atomically
from clawproxy.engine.client import TRANSIENT, Engine
from clawproxy.errors import ConfigError, EngineError
from clawproxy.store import Store
from clawproxy.users import adapter_name

log = logging.getLogger(__name__)


@dataclass
class Version:
    version: int
    path: Path
    format: str  # full | lora (the checkpoints table's kind column)

    @property
    def lora(self) -> bool:
        return self.format == "lora"


def checkpoints_root(data_dir: Path) -> Path:
    return Path(data_dir) / "checkpoints"


def current_version(store: Store, base_dir: Path, owner: str | None = None) -> Version:
    """What serves ``owner`` (None: the shared adapter): their newest published checkpoint, else
    the shared one if they share, else the base model (``Store.adapter_for``)."""
    row = store.adapter_for(owner)
    if row is None:
        return Version(0, Path(base_dir), "full")
    return Version(int(row["version"]), Path(row["path"]), row["format"])


def version_info(store: Store, version: int, base_dir: Path) -> Version:
    if version == 0:
        return Version(0, Path(base_dir), "full")
    row = store.checkpoint(version)
    if row is None:
        raise ConfigError(f"no checkpoint v{version}; `clawproxy stats` lists the versions.")
    path = Path(row["path"])
    if row["status"] == "deleted" or not path.exists():
        raise ConfigError(
            f"checkpoint v{version} was deleted (only the last trainer.keep_checkpoints are kept); "
            "pick a newer version or 0 (the base model)."
        )
    return Version(version, path, row["format"])


def next_version(store: Store) -> int:
    return store.max_checkpoint_version() + 1


def write_atomically(out_dir: Path, save: Any) -> Path:
    """Call ``save(tmp_dir)`` and move the finished directory to ``out_dir`` in one rename.

    A crash leaves only a ``.tmp-*`` directory (ignored, cleaned next time), never a half-written
    ``v<N>``. A leftover ``v<N>`` from a crash after the rename but before the store row was written
    is replaced: without a row it was never published.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.parent.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return write_dir_atomically(out_dir, save)


def prune(store: Store, keep: int, root: Path) -> list[int]:
    """Delete the directories of each owner's published versions older than their newest ``keep``;
    mark them deleted.

    A directory still referenced by a kept row (a rollback points at an old dir) stays on disk, and
    only directories under ``root`` (the trainer's checkpoints) are ever deleted: a rollback to v0
    records the base model's directory, which is the user's model, not ours.
    """
    kept: list[dict[str, Any]] = []
    old: list[dict[str, Any]] = []
    seen: dict[str | None, int] = {}
    for r in store.published_checkpoints():  # newest first
        seen[r["user"]] = seen.get(r["user"], 0) + 1
        (kept if seen[r["user"]] <= keep else old).append(r)
    kept_paths = {r["path"] for r in kept}
    root = Path(root).resolve()
    deleted = []
    for r in old:
        if r["path"] not in kept_paths and Path(r["path"]).resolve().parent == root:
            shutil.rmtree(r["path"], ignore_errors=True)
        store.mark_checkpoint_deleted(r["version"])
        deleted.append(int(r["version"]))
    return deleted


def rollback(
    store: Store, engine: Engine | None, base_dir: Path, target: int | None = None, owner: str | None = None
) -> tuple[int, Version]:
    """Serve an earlier checkpoint of ``owner``'s adapter (None: the shared one) again, recorded as
    a new version of that adapter. Returns (new_version, source).

    ``target`` None means that owner's version before their current one; another owner's version
    is refused. The engine reloads first; only a reload that worked is recorded (a refused one
    raises EngineError, the engine is given the current version back, and nothing is recorded).
    """
    with store.publish_lock():
        return _rollback(store, engine, base_dir, target, owner)


def _rollback(store: Store, engine: Engine | None, base_dir: Path, target: int | None,
              owner: str | None) -> tuple[int, Version]:
    whose = "the shared adapter" if owner is None else f"user {owner}'s adapter"
    own = store.serving_checkpoint(owner)
    if owner is not None and own is None:
        raise ConfigError(f"{whose} has no checkpoint yet; nothing to roll back.")
    current = current_version(store, base_dir, owner)
    if target is None:
        target = store.published_before(current.version, owner) or 0
    if target == current.version:
        raise ConfigError(f"v{target} is already the current version of {whose}.")
    row = store.checkpoint(target) if target else None
    if row is not None and row["user"] != owner:
        raise ConfigError(f"v{target} is not a version of {whose}; `clawproxy stats` lists the versions.")
    source = version_info(store, target, base_dir)
    new = next_version(store)
    if engine is not None:
        publish(engine, Version(new, source.path, source.format), current, base_dir, owner)
    store.record_rollback(new, str(source.path), source.format, target=target, from_version=current.version,
                          engine=engine is not None, owner=owner)
    return new, source


class CheckpointInvalid(EngineError):
    """A checkpoint directory the engine must not be asked to load (incomplete, unreadable,
    other tensors than the model has)."""

    status = 422
    type = "invalid_checkpoint"


def validate_checkpoint(path: Path, format: str, base_dir: Path | None = None) -> None:
    """Raise CheckpointInvalid unless ``path`` is a complete checkpoint of ``format`` (lora | full).

    Reads every safetensors header (safetensors also checks the file is as long as the header
    says: a file cut short by a full disk fails here) and, for a
    full checkpoint, checks its tensor names and shapes against the base model's, so the engine
    never gets a directory it would load only partly."""
    from safetensors import safe_open

    path = Path(path)
    config = "adapter_config.json" if format == "lora" else "config.json"
    try:
        json.loads((path / config).read_text())
    except (OSError, ValueError) as e:
        raise CheckpointInvalid(f"checkpoint {path}: {config} unreadable ({e})") from None
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointInvalid(f"checkpoint {path}: no .safetensors files")
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="numpy") as st:
                for name in st.keys():
                    shapes[name] = tuple(st.get_slice(name).get_shape())
        except Exception as e:  # safetensors' own errors: bad header, file shorter than it says
            raise CheckpointInvalid(f"checkpoint {path}: {f.name} unreadable ({e})") from None
    if format == "lora":
        if not any("lora_A" in n for n in shapes) or not any("lora_B" in n for n in shapes):
            raise CheckpointInvalid(f"checkpoint {path}: no lora_A/lora_B tensors in the adapter")
        return
    base_files = sorted(Path(base_dir).glob("*.safetensors")) if base_dir is not None else []
    if not base_files:
        return  # base model not in safetensors (gguf): nothing to compare against
    want: dict[str, tuple[int, ...]] = {}
    for f in base_files:
        with safe_open(str(f), framework="numpy") as st:
            for name in st.keys():
                want[name] = tuple(st.get_slice(name).get_shape())
    missing = sorted(set(want) - set(shapes))
    wrong = sorted(n for n in set(want) & set(shapes) if want[n] != shapes[n])
    if missing or wrong:
        raise CheckpointInvalid(f"checkpoint {path}: {len(missing)} tensors missing ({missing[:3]}), "
                                f"{len(wrong)} of another shape ({wrong[:3]}) than the base model's")


def is_refusal(err: EngineError) -> bool:
    """True when the engine answered that it cannot load this checkpoint (any 4xx, or a 500 from
    the load itself); False when it could not be asked (unreachable, 502/503/504): only then
    are the samples worth training again."""
    return err.status not in TRANSIENT


def adapter_of(engine: Engine, owner: str | None) -> str:
    """The name ``owner``'s adapter is served under (None: the shared one)."""
    return engine.lora_name if owner is None else adapter_name(owner, engine.lora_name)


def publish(engine: Engine, new: Version, last_good: Version, base_dir: Path | None = None,
            owner: str | None = None) -> None:
    """Validate ``new``, load it into the engine as ``owner``'s adapter; after a failed load put
    ``last_good`` back.

    Raises CheckpointInvalid (the engine was not asked) or the engine's EngineError (the engine
    serves ``last_good`` again, or, if even that failed, the message says so)."""
    validate_checkpoint(new.path, new.format, base_dir)
    name = adapter_of(engine, owner)
    try:
        engine.load_weights(str(new.path), new.version, lora=new.lora, name=name)
    except EngineError as err:
        if new.lora and not last_good.lora:
            raise  # a refused adapter never touched the base weights that serve
        try:
            engine.load_weights(str(last_good.path), last_good.version, lora=last_good.lora, name=name)
        except EngineError as again:
            err.message += f"; reloading v{last_good.version} failed too: {again.message}"
        raise err from None


def engine_serves(engine: Engine, current: Version, owner: str | None = None) -> bool:
    """Whether the engine serves ``current`` for ``owner``: an engine that serves adapters by name
    (vLLM) lists the owner's adapter with this path for a LoRA version; otherwise the engine's
    weight version matches."""
    if current.lora and engine.spec.adapters_by_name:
        return engine.served_adapters().get(adapter_of(engine, owner)) == str(current.path)
    return engine.weight_version() == current.version


def ensure_engine_serves(store: Store, engine: Engine, base_dir: Path) -> bool:
    """Reload the current version of each owner's weights into an engine that restarted on the base
    model or serves another version (the shared one, and each user's own). True if any was reloaded.

    An adapter that an engine serving adapters by name (vLLM) has lost is only reported (a "lost"
    event): the proxy owns loading it back (``clawproxy/proxy/routing.py``), since it sees the 404 on
    the request that needs it and runs whether or not the trainer does."""
    reloaded = False
    for owner in store.owners():
        if owner is not None and store.serving_checkpoint(owner) is None:
            continue  # served the shared adapter or the base model: nothing of theirs to load
        current = current_version(store, base_dir, owner)
        try:
            if engine_serves(engine, current, owner):
                continue
            if lost_adapter(engine, current, owner):
                _report_lost(store, engine, current, owner)
                continue
            serving = engine.weight_version()
        except EngineError:
            continue
        engine.load_weights(str(current.path), current.version, lora=current.lora, name=adapter_of(engine, owner))
        event = {"reason": "engine serves a different version", "serving": serving, "version": current.version}
        store.log_event("reload", event if owner is None else {**event, "user": owner})
        reloaded = True
    return reloaded


def lost_adapter(engine: Engine, current: Version, owner: str | None) -> str | None:
    """The name of ``owner``'s adapter when an engine that serves adapters by name does not list it
    (it restarted); None otherwise."""
    if not (current.lora and engine.spec.adapters_by_name):
        return None
    name = adapter_of(engine, owner)
    return None if name in engine.served_adapters() else name


def _report_lost(store: Store, engine: Engine, current: Version, owner: str | None) -> None:
    name = lost_adapter(engine, current, owner)
    event = {"adapter": name, "path": str(current.path), "version": current.version,
             **({"user": owner} if owner is not None else {})}
    if event not in (e["data"] for e in store.events_of("lost")):  # once per version lost, not per poll
        store.log_event("lost", event)
        log.info("the engine lost adapter %r (v%d); the proxy loads it again on its next request",
                 name, current.version)
