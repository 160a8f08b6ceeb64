"""Checkpoints on disk and in the store: atomic writes, the current version, pruning, rollback.

Layout: ``<data_dir>/checkpoints/v<N>/`` holds a Hugging Face model directory (``model.safetensors``
+ ``config.json`` + tokenizer files) or a PEFT adapter directory (``adapter_model.safetensors`` +
``adapter_config.json``). Version 0 is the engine's starting model (``engine.model`` resolved with
``resolve_model``); it has no row and is never deleted.

The ``checkpoints`` table is the source of truth for "what is serving": the current version is the
highest ``published`` row. A rollback publishes a *new* version number whose row points at the old
directory, so versions only grow (staleness arithmetic stays valid) and the history shows the
rollback as its own step.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawproxy.engine.model import write_dir_atomically
from clawproxy.errors import ConfigError, EngineError
from clawproxy.store import Store, dumps


@dataclass
class Version:
    version: int
    path: Path
    kind: str  # full | lora

    @property
    def lora(self) -> bool:
        return self.kind == "lora"


def checkpoints_root(data_dir: Path) -> Path:
    return Path(data_dir) / "checkpoints"


def current_version(store: Store, base_dir: Path) -> Version:
    """What the engine should be serving: the newest published checkpoint, else the base model."""
    row = store.query_one(
        "SELECT version, path, kind FROM checkpoints WHERE status='published' ORDER BY version DESC LIMIT 1"
    )
    if row is None:
        return Version(0, Path(base_dir), "full")
    return Version(int(row["version"]), Path(row["path"]), row["kind"])


def version_info(store: Store, version: int, base_dir: Path) -> Version:
    if version == 0:
        return Version(0, Path(base_dir), "full")
    row = store.query_one("SELECT version, path, kind, status FROM checkpoints WHERE version=?", (version,))
    if row is None:
        raise ConfigError(f"no checkpoint v{version}; `clawproxy stats` lists the versions.")
    path = Path(row["path"])
    if row["status"] == "deleted" or not path.exists():
        raise ConfigError(
            f"checkpoint v{version} was deleted (only the last trainer.keep_checkpoints are kept); "
            "pick a newer version or 0 (the base model)."
        )
    return Version(version, path, row["kind"])


def next_version(store: Store) -> int:
    row = store.query_one("SELECT MAX(version) AS v FROM checkpoints")
    return int(row["v"] or 0) + 1 if row else 1


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
    """Delete the directories of published versions older than the newest ``keep``; mark them deleted.

    A directory still referenced by a kept row (a rollback points at an old dir) stays on disk, and
    only directories under ``root`` (the trainer's checkpoints) are ever deleted: a rollback to v0
    records the base model's directory, which is the user's model, not ours.
    """
    rows = store.query(
        "SELECT version, path FROM checkpoints WHERE status='published' ORDER BY version DESC"
    )
    kept, old = rows[:keep], rows[keep:]
    kept_paths = {r["path"] for r in kept}
    root = Path(root).resolve()
    deleted = []
    for r in old:
        if r["path"] not in kept_paths and Path(r["path"]).resolve().parent == root:
            shutil.rmtree(r["path"], ignore_errors=True)
        store.update("checkpoints", "version", r["version"], {"status": "deleted"})
        deleted.append(int(r["version"]))
    return deleted


@contextmanager
def publish_lock(store: Store) -> Iterator[None]:
    """Serializes whoever changes the served version (a trainer publishing, `clawproxy rollback`):
    an exclusive ``flock`` on a file beside the store, held from reading the current version until
    the engine took the new one and it is recorded. Without it a step trained from v5 could publish
    over a rollback made while it trained."""
    import fcntl

    path = store.path.with_name(store.path.name + ".publish.lock")
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def rollback(
    store: Store, engine: Any | None, base_dir: Path, target: int | None = None
) -> tuple[int, Version]:
    """Serve an earlier checkpoint again, recorded as a new version. Returns (new_version, source).

    ``target`` None means the version before the current one. The engine reloads first; only a
    reload that worked is recorded (a refused one raises EngineError and changes nothing).
    """
    with publish_lock(store):
        return _rollback(store, engine, base_dir, target)


def _rollback(store: Store, engine: Any | None, base_dir: Path, target: int | None) -> tuple[int, Version]:
    current = current_version(store, base_dir)
    if target is None:
        row = store.query_one(
            "SELECT version FROM checkpoints WHERE status='published' AND version < ? "
            "ORDER BY version DESC LIMIT 1",
            (current.version,),
        )
        target = int(row["version"]) if row else 0
    if target == current.version:
        raise ConfigError(f"v{target} is already the current version.")
    source = version_info(store, target, base_dir)
    new = next_version(store)
    if engine is not None:
        engine.load_weights(str(source.path), new, lora=source.lora)
    with store.transaction() as conn:
        conn.execute(
            "INSERT INTO checkpoints (version, path, kind, created_at, step_id, status, gate) "
            "VALUES (?, ?, ?, ?, NULL, 'published', ?)",
            (new, str(source.path), source.kind, time.time(), dumps({"rollback_of": target})),
        )
        conn.execute(
            "INSERT INTO events (ts, kind, data) VALUES (?, 'rollback', ?)",
            (time.time(), dumps({"from": current.version, "to": target, "new_version": new,
                                 "engine": engine is not None})),
        )
    return new, source


def ensure_engine_serves(store: Store, engine: Any, base_dir: Path) -> bool:
    """Reload the current version into an engine that restarted on the base model. True if reloaded."""
    current = current_version(store, base_dir)
    try:
        serving = engine.weight_version()
    except EngineError:
        return False
    if serving == current.version:
        return False
    engine.load_weights(str(current.path), current.version, lora=current.lora)
    store.log_event("reload", {"reason": "engine serves a different version", "serving": serving,
                               "version": current.version})
    return True
