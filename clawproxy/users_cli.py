"""`clawproxy users add|list|show|remove|share|prefer|unprefer|trying`: the people who share this proxy (clawproxy/users.py).

Light imports only: this runs on every `clawproxy` invocation.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click
from click_default_group import DefaultGroup

from clawproxy.cli_options import CONTEXT_SETTINGS as CTX
from clawproxy.cli_options import build_config, config_options, make_console
from clawproxy.config import Config
from clawproxy.errors import ClawproxyError
from clawproxy.store import Store
from clawproxy.store.preferences import shown_preferences
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
    from rich.table import Table

    table = Table(title=f"{len(rows)} user(s)", title_justify="left")
    for col in ("user", "shares", "turns", "adapter"):
        table.add_column(col, justify="right" if col == "turns" else "left")
    for r in rows:
        table.add_row(r["name"], "yes" if r["shared"] else "no", str(r["turns"]),
                      f"v{r['version']}" if r["version"] else "none yet")
    make_console().print(table)


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
        prefs = shown_preferences(store.preferences_of(name, ("active", "candidate", "demoted")), cfg.trying.apply)
        trying = {**store.trying_counts(name), "on": cfg.trying.enabled and not (user and not user["trying"])}
    finally:
        store.close()
    out = {"name": name, "shared": bool(user["shared"]) if user else None, "judged": judged,
           "praised": counts.get(1, 0), "complained": counts.get(-1, 0), "preferences": prefs,
           "trying": trying, "reactions": rows}
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    from rich.markup import escape
    from rich.table import Table

    who = name or "the one user (no users added)"
    console = make_console()
    console.print(f"{escape(who)}: {judged['judged']} turn(s) judged, {judged['scored']} scored, "
                  f"{judged['abstained']} abstained (too unsure), {judged['neutral']} neutral")
    console.print(f"trying {'on' if trying['on'] else 'off'}: {trying['tried']} of {trying['turns']} answer(s) "
                  "served under a candidate instruction")
    if prefs:
        ptable = Table(title="what was found by trying (remove one: `clawproxy users unprefer "
                       f"{escape(name or '')}{' ' if name else ''}ID`)", title_justify="left")
        for col in ("id", "status", "instruction", "from", "tries", "good", "bad", "served"):
            ptable.add_column(col, overflow="fold")
        for p in prefs:
            ptable.add_row(str(p["id"]), p["status"], escape(p["text"]), p["source"], str(p["tries"]),
                           f"{p['good']} (+{p['leaned_good']} unsure)", f"{p['bad']} (+{p['leaned_bad']} unsure)",
                           p["served"])
        console.print(ptable)
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


def _who_and(args: tuple[str, ...], what: str, store: Store) -> tuple[str | None, str]:
    """``[NAME] VALUE``: a proxy with no users names no one."""
    if len(args) == 1:
        if store.has_users():
            raise click.UsageError(f"this proxy has users: name one, e.g. `clawproxy users {what} NAME ...`.")
        return None, args[0]
    if len(args) != 2:
        raise click.UsageError(f"give [NAME] and one value: `clawproxy users {what} NAME VALUE`.")
    _known(store, args[0])
    return args[0], args[1]


@users.command(context_settings=CTX)
@click.argument("args", nargs=-1, required=True, metavar="[NAME] INSTRUCTION")
@config_options
def prefer(args: tuple[str, ...], config_path: str | None, data_dir: str | None) -> None:
    """Add an active preference by hand: an instruction about style or form, applied to NAME's
    answers and distilled into their adapter (`users show` lists it; `users unprefer` removes it)."""
    cfg = build_config(config_path, data_dir)
    store = _store(cfg)
    try:
        name, text = _who_and(args, "prefer", store)
        text = " ".join(text.split())
        if not text:
            raise click.UsageError("the instruction is empty; e.g. `clawproxy users prefer NAME \"Answer in bullet points.\"`")
        pid = store.add_preference(name, text, "manual", status="active")
    finally:
        store.close()
    click.echo(f"preference {pid} active for {name or 'the one user'}: {text}")


@users.command(context_settings=CTX)
@click.argument("args", nargs=-1, required=True, metavar="[NAME] ID")
@config_options
def unprefer(args: tuple[str, ...], config_path: str | None, data_dir: str | None) -> None:
    """Remove preference ID (from `users show`): never applied, trained or tried for NAME again."""
    cfg = build_config(config_path, data_dir)
    store = _store(cfg)
    try:
        name, ident = _who_and(args, "unprefer", store)
        row = store.preference(int(ident)) if ident.isdigit() else None
        if row is None or row["user"] != name:
            raise click.ClickException(f"no preference {ident} for {name or 'the one user'}; "
                                       "`clawproxy users show` lists them with their ids.")
        store.set_preference_status(int(ident), "removed")
    finally:
        store.close()
    click.echo(f"removed preference {ident}: {row['text']}")


@users.command(context_settings=CTX)
@click.argument("name")
@click.option("--on/--off", "on", required=True, help="Let the proxy try candidate instructions on NAME.")
@config_options
def trying(name: str, on: bool, config_path: str | None, data_dir: str | None) -> None:
    """Let NAME's answers be tried under candidate instructions when they are unhappy (--on), or
    never (--off; their active preferences still apply). `trying.enabled` is the switch for everyone."""
    cfg = build_config(config_path, data_dir)
    store = _store(cfg)
    try:
        _known(store, name)
        store.set_trying(name, on)
    finally:
        store.close()
    click.echo(f"trying is {'on' if on else 'off'} for {name}")


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
    """Remove NAME: their key, sessions, turns, train steps and adapter (files, and from the engine)."""
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
               + ("; the engine unloaded their adapter" if unloaded else ""))


def _unload(cfg: Config, name: str) -> bool:
    """Unload the adapter from a running engine that serves adapters by name, if one answers and has it."""
    if not cfg.engine.spec.adapters_by_name:
        return False
    from clawproxy.engine.client import EngineClient

    try:
        # reload_timeout: llama.cpp unloads by starting a llama-server without the adapter
        EngineClient(cfg.engine_url, kind=cfg.engine.kind, token=cfg.engine.control_token, timeout=5.0,
                     reload_timeout=120.0).unload_adapter(name)
    except ClawproxyError:  # no engine running, or it never loaded this adapter
        return False
    return True
