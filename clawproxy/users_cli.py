"""`clawproxy users add|list|show|remove|share`: the people who share this proxy (clawproxy/users.py).

Light imports only: this runs on every `clawproxy` invocation.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click
from click_default_group import DefaultGroup

from clawproxy.cli_options import CONTEXT_SETTINGS as CTX
from clawproxy.cli_options import build_config, config_options
from clawproxy.config import Config
from clawproxy.errors import ClawproxyError
from clawproxy.store import Store
from clawproxy.users import adapter_name, check_name, create


def _store(cfg: Config) -> Store:
    cfg.data_path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return Store(cfg.db_path)


def _known(store: Store, name: str) -> None:
    if store.get_user(name) is None:
        raise click.ClickException(f"no user {name!r}; `clawproxy users list` shows them.")


@click.group(cls=DefaultGroup, default="list", default_if_no_args=True, context_settings=CTX)
def users() -> None:
    """People who share this proxy, each with their own adapter (`users` alone is `users list`)."""


@users.command(context_settings=CTX)
@click.argument("name")
@click.option("--share/--no-share", default=False, show_default=True,
              help="Their turns also train the shared adapter, which serves them until they have their own.")
@config_options
def add(name: str, share: bool, config_path: str | None, data_dir: str | None) -> None:
    """Add NAME and print their API key (shown once; only a keyed hash of it is kept)."""
    check_name(name)
    cfg = build_config(config_path, data_dir)
    store = _store(cfg)
    try:
        if store.get_user(name) is not None:
            raise click.ClickException(f"user {name!r} exists; pick another name, or "
                                       f"`clawproxy users remove {name}` first.")
        key = create(store, cfg.data_path, name, shared=share)
    finally:
        store.close()
    click.echo(f"added user {name} ({'shares' if share else 'does not share'}); their API key, shown once:")
    click.echo(f"  {key}")
    click.echo(f"{name} configures their OpenClaw with:")
    click.echo(f"  clawproxy openclaw-config --api-key {key} --write")


@users.command("list", context_settings=CTX)
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@config_options
def list_users(as_json: bool, config_path: str | None, data_dir: str | None) -> None:
    """Each user: whether they share, their turns, their adapter's version (never their key)."""
    cfg = build_config(config_path, data_dir)
    if not cfg.db_path.exists():
        rows = []
    else:
        store = Store(cfg.db_path)
        try:
            rows = [{"name": r["name"], "shared": bool(r["shared"]), "turns": r["turns"],
                     "version": r["version"], "adapter": adapter_name(r["name"]) if r["version"] else None,
                     "created_at": r["created_at"]} for r in store.list_users()]
        finally:
            store.close()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no users: one person, no key needed. `clawproxy users add NAME` adds one.")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(rows)} user(s)", title_justify="left")
    for col in ("user", "shares", "turns", "adapter"):
        table.add_column(col, justify="right" if col == "turns" else "left")
    for r in rows:
        table.add_row(r["name"], "yes" if r["shared"] else "no", str(r["turns"]),
                      f"v{r['version']}" if r["version"] else "none yet")
    Console().print(table)


@users.command(context_settings=CTX)
@click.argument("name", required=False)
@click.option("-n", "--limit", type=int, default=20, show_default=True, help="Newest reactions to show.")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@config_options
def show(name: str | None, limit: int, as_json: bool, config_path: str | None, data_dir: str | None) -> None:
    """NAME and what they told the model: their reactions to its answers, in their own words, newest
    first (the judge's memory; without NAME, the one user of a proxy with no users)."""
    from clawproxy.openclaw import last_user_text

    cfg = build_config(config_path, data_dir)
    if not cfg.db_path.exists():
        raise click.ClickException(f"no store at {cfg.db_path}; `clawproxy start` records one.")
    store = Store(cfg.db_path)
    try:
        if name is not None:
            _known(store, name)
        user = store.get_user(name) if name is not None else None
        counts = store.reaction_counts(name)
        rows = [{"turn_id": r["turn_id"], "score": r["score"], "said": r["text"], "created_at": r["created_at"],
                 "session_id": r["session_id"],
                 "about": last_user_text(r["request_messages"] or [])[:200]}
                for r in store.reactions_of(name, limit=limit)]
        judged = store.judge_summary(name, all_users=False)
    finally:
        store.close()
    out = {"name": name, "shared": bool(user["shared"]) if user else None, "judged": judged,
           "praised": counts.get(1, 0), "complained": counts.get(-1, 0), "reactions": rows}
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    who = name or "the one user (no users added)"
    console = Console()
    console.print(f"{escape(who)}: {judged['judged']} turn(s) judged, {judged['scored']} scored, "
                  f"{judged['abstained']} abstained (too unsure), {judged['neutral']} neutral")
    if not rows:
        console.print("nothing told yet: reactions appear here once the judge scores a turn they replied to.")
        return
    table = Table(title=f"what {escape(who)} told the model ({out['praised']} praised, "
                  f"{out['complained']} complained; newest {len(rows)})", title_justify="left")
    for col in ("turn", "verdict", "they said", "about their request"):
        table.add_column(col, overflow="fold")
    for r in rows:  # the user's words are data, never markup
        table.add_row(str(r["turn_id"]), "praised" if r["score"] > 0 else "complained",
                      escape(r["said"]), escape(r["about"]))
    console.print(table)


@users.command(context_settings=CTX)
@click.argument("name")
@click.option("--on/--off", "on", required=True, help="Opt in to (or out of) the shared adapter.")
@config_options
def share(name: str, on: bool, config_path: str | None, data_dir: str | None) -> None:
    """Opt NAME in to the shared adapter (--on) or out of it (--off)."""
    cfg = build_config(config_path, data_dir)
    store = _store(cfg)
    try:
        _known(store, name)
        store.set_shared(name, on)
    finally:
        store.close()
    click.echo(f"{name} {'shares' if on else 'does not share'} from now on"
               + ("" if on else ": their new turns do not train the shared adapter, and it no longer serves them"))


@users.command(context_settings=CTX)
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@config_options
def remove(name: str, yes: bool, config_path: str | None, data_dir: str | None) -> None:
    """Remove NAME: their key, sessions, turns, train steps and adapter (files, and from vLLM)."""
    cfg = build_config(config_path, data_dir)
    store = _store(cfg)
    try:
        _known(store, name)
        if not yes and not click.confirm(f"Remove user {name} and everything recorded and trained for "
                                         "them? This cannot be undone", default=False):
            raise click.Abort()
        # under the publish lock: a step in flight for them either published before, and its
        # checkpoint goes with the rest, or sees them gone and keeps nothing
        with store.publish_lock():
            paths = store.remove_user(name)
            for p in paths:
                shutil.rmtree(Path(p), ignore_errors=True)
            unloaded = _unload(cfg, adapter_name(name))
        store.purge_free_pages()
    finally:
        store.close()
    click.echo(f"removed user {name}: their data and {len(paths)} checkpoint(s)"
               + ("; vLLM unloaded their adapter" if unloaded else ""))


def _unload(cfg: Config, name: str) -> bool:
    """Unload the adapter from a running vLLM, if one answers and has it."""
    if not cfg.engine.spec.adapters_by_name:
        return False
    from clawproxy.engine.client import EngineClient

    try:
        EngineClient(cfg.engine_url, kind=cfg.engine.kind, token=cfg.engine.control_token, timeout=5.0).unload_adapter(name)
    except ClawproxyError:  # no vLLM running, or it never loaded this adapter
        return False
    return True
