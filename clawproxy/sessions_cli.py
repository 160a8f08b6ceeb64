"""`clawproxy sessions list|show|export|delete`.

Reads the store directly (SQLite WAL allows it while `clawproxy start` is writing). Imports only
light modules: this runs on every `clawproxy` invocation.

Everything a client sent (session keys, messages, tool output) reaches the terminal as a Rich
``Text`` with its control characters spelled out (``_text``): never parsed as markup, never an
escape sequence the terminal would act on.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from click_default_group import DefaultGroup

from clawproxy.cli_options import CONTEXT_SETTINGS as CTX
from clawproxy.cli_options import build_config, config_options, make_console
from clawproxy.errors import StoreError
from clawproxy.store import Store
from clawproxy.turn_view import message_text, printable, turn_view


@contextmanager
def _open_store(config_path: str | None, data_dir: str | None) -> Iterator[Store]:
    cfg = build_config(config_path, data_dir)
    if not cfg.db_path.exists():
        raise click.ClickException(
            f"no store at {cfg.db_path}; run `clawproxy start` first or pass --data-dir."
        )
    store = Store(cfg.db_path)
    try:
        yield store
    finally:
        store.close()


def _ts(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _ts_short(t: float | None) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(t)) if t else "-"


def _iso(t: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}Z" if t else None


def _resolve(store: Store, sid: str) -> str:
    """An exact session id, or a unique prefix of one."""
    if store.get_session(sid):
        return sid
    rows = store.session_ids_starting(sid, limit=3)
    if len(rows) == 1:
        return rows[0]
    if not rows:
        raise click.ClickException(f"no session {sid!r}; `clawproxy sessions` lists them.")
    raise click.ClickException(f"{sid!r} matches several sessions; give more of the id.")


def _text(s: str) -> Any:
    """Untrusted ``s`` as a Rich ``Text``: no markup (``[/bold]``, ``[link=...]``), no control codes."""
    from rich.text import Text

    return Text(printable(s))


def _short(s: str | None, n: int = 80) -> str:
    s = " ".join((s or "").split())
    return s if len(s) <= n else s[: n - 1] + "…"


# -- sessions ------------------------------------------------------------------------------------
@click.group(cls=DefaultGroup, default="list", default_if_no_args=True, context_settings=CTX)
def sessions() -> None:
    """Inspect what was collected (`sessions` alone is `sessions list`, options included)."""


@sessions.command("list", context_settings=CTX)
@click.option("-n", "--limit", type=int, default=20, show_default=True, help="Most recent N sessions.")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@click.option("--user", default=None, help="Only this user's sessions (`clawproxy users` lists them).")
@config_options
def list_sessions(limit: int, as_json: bool, user: str | None, config_path: str | None,
                  data_dir: str | None) -> None:
    """Sessions, most recent first: turns, trainable turns, mean judge score."""
    with _open_store(config_path, data_dir) as store:
        if user is not None and store.get_user(user) is None:
            raise click.ClickException(f"no user {user!r}; `clawproxy users` lists them.")
        rows = store.list_sessions(limit if limit and limit > 0 else None, user=user)
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    from rich.table import Table

    table = Table(title=f"{len(rows)} session(s)", title_justify="left")
    for col, kw in (("session", {"overflow": "fold", "min_width": 12}),
                    ("first", {"no_wrap": True}), ("last", {"no_wrap": True}),
                    ("main", {"justify": "right"}), ("side", {"justify": "right"}),
                    ("trainable", {"justify": "right"}), ("judge", {"justify": "right"})):
        table.add_column(col, **kw)
    for r in rows:
        score = (f"{r['mean_score']:+.2f} ({r['judged_turns']})"
                 if r.get("mean_score") is not None else "-")
        sid = r["id"] + (" (done)" if r.get("finalized_at") else "")
        table.add_row(_text(sid), _ts_short(r["first_seen"]), _ts_short(r["last_seen"]),
                      str(r["main_turns"] or 0), str(r["side_turns"] or 0),
                      str(r["trainable_turns"] or 0), score)
    make_console().print(table)


@sessions.command("show", context_settings=CTX)
@click.argument("session_id")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@config_options
def show(session_id: str, as_json: bool, config_path: str | None, data_dir: str | None) -> None:
    """One session's turns: kind, trainable reason, response and next state."""
    with _open_store(config_path, data_dir) as store:
        sid = _resolve(store, session_id)
        sess = store.get_session(sid)
        if sess is None:  # deleted since _resolve found it
            raise click.ClickException(f"no session {sid!r}; `clawproxy sessions` lists them.")
        turns = store.session_turns(sid)
    if as_json:
        click.echo(json.dumps({"session": sess, "turns": turns}, indent=2, default=str))
        return
    from rich.table import Table

    title = (f"session {sid}  ({sess['source']}, {sess.get('session_key') or 'no key'}, "
             f"first {_ts(sess['first_seen'])}, last {_ts(sess['last_seen'])})")
    table = Table(title=_text(title), title_justify="left", show_lines=True)
    for col in ("#", "time", "kind", "status", "train", "user", "response", "next state", "score"):
        table.add_column(col, overflow="fold", no_wrap=col in ("#", "time"))
    for t in turns:
        v = turn_view(t)
        resp = " ".join([v["response"], *v["tool_calls"]]).strip()
        ns_txt = " | ".join(_short(x, 60) for x in v["next_state"]) if v["next_state"] else "-"
        table.add_row(str(v["index"]), time.strftime("%H:%M:%S", time.localtime(t["created_at"])),
                      *(_text(x) for x in (v["kind"], v["status"],
                                           "yes" if v["trainable"] else f"no: {v['reason']}",
                                           _short(v["request"], 60), _short(resp, 80), ns_txt)),
                      str(v["score"]) if v["score"] is not None else "-")
    make_console().print(table)


def prompt_text(messages: list[Any] | None) -> str:
    """A plain rendering of the prompt (the exact tokens are in prompt_token_ids)."""
    out = []
    for m in messages or []:
        if isinstance(m, dict):
            out.append(f"<|{m.get('role', '?')}|>\n{message_text(m)}")
    return "\n".join(out)


def export_record(t: dict[str, Any]) -> dict[str, Any]:
    """One turn in the published JSONL shape plus our fields."""
    return {
        "session_id": t["session_id"],
        "turn": t.get("turn_index"),
        "timestamp": _iso(t["created_at"]),
        "messages": t.get("request_messages"),
        "prompt_text": prompt_text(t.get("request_messages")),
        "response_text": t.get("response_text"),
        "tool_calls": t.get("response_tool_calls"),
        "next_state": t.get("next_state"),
        "next_state_role": t.get("next_state_role"),
        "turn_id": t["id"],
        "request_id": t["request_id"],
        "kind": t["kind"],
        "side_kind": t.get("side_kind"),
        "status": t["status"],
        "http_status": t.get("http_status"),
        "trainable": bool(t["trainable"]),
        "reason": t.get("reason"),
        "finish_reason": t.get("finish_reason"),
        "reasoning": t.get("response_reasoning"),
        "model": t.get("model"),
        "tools": t.get("request_tools"),
        "params": t.get("request_params"),
        "compaction": t.get("compaction"),
        "usage": t.get("usage"),
        "weight_version": t.get("weight_version"),
        "weight_versions": t.get("weight_versions"),
        "prompt_token_ids": t.get("prompt_token_ids"),
        "completion_token_ids": t.get("completion_token_ids"),
        "completion_logprobs": t.get("completion_logprobs"),
        "ttft_ms": t.get("ttft_ms"),
        "total_ms": t.get("total_ms"),
        "judge_score": t.get("judge_score"),
        "judge_hint": t.get("judge_hint"),
    }


@sessions.command("export", context_settings=CTX)
@click.option("--out", "out_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write here instead of stdout.")
@click.option("--session", "session_id", default=None, help="Only this session.")
@config_options
def export(out_path: str | None, session_id: str | None, config_path: str | None,
           data_dir: str | None) -> None:
    """JSONL, one line per turn: session_id, turn, timestamp, messages, prompt_text, response_text,
    tool_calls, next_state, plus kind, trainable, reason, token ids, log-probs, judge score..."""
    import orjson

    n = 0
    with _open_store(config_path, data_dir) as store:
        sid = _resolve(store, session_id) if session_id else None
        # Owner-only, like the store: an export holds every conversation in full.
        out = (os.fdopen(os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
               if out_path else sys.stdout.buffer)
        try:
            last = 0
            while True:  # in pages: a store can hold more turns than we want in memory
                rows = store.turns_page(sid, last, limit=500)
                if not rows:
                    break
                for t in rows:
                    out.write(orjson.dumps(export_record(t)) + b"\n")
                    n += 1
                last = rows[-1]["id"]
        finally:
            if out_path:
                out.close()
            else:
                out.flush()
    if out_path:
        click.echo(f"exported {n} turn(s) to {out_path}", err=True)


@sessions.command("delete", context_settings=CTX)
@click.argument("session_id", required=False)
@click.option("--all", "delete_all", is_flag=True, help="Delete every session and turn.")
@click.option("--purge", "purge_only", is_flag=True,
              help="Delete nothing; only wipe what earlier deletes left in free pages and the WAL.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@config_options
def delete(session_id: str | None, delete_all: bool, purge_only: bool, yes: bool,
           config_path: str | None, data_dir: str | None) -> None:
    """Delete a session (or --all) with its turns and judgments, overwriting the freed pages."""
    if purge_only:
        n, what = 0, "nothing new"
    elif bool(session_id) == bool(delete_all):
        raise click.UsageError("give a SESSION_ID or --all (not both), or --purge.")
    with _open_store(config_path, data_dir) as store:
        if not purge_only:
            sid = _resolve(store, session_id) if session_id else None
            what = f"session {printable(sid)}" if sid else "ALL sessions and turns"
            if not yes and not click.confirm(f"Delete {what}? This cannot be undone", default=False):
                raise click.Abort()
            n = store.delete_session(sid) if sid else store.delete_all()
        try:
            store.purge_free_pages()
        except StoreError as e:
            raise click.ClickException(f"deleted {what} ({n} turn(s)), but {e.message}") from e
    click.echo(f"deleted {what} ({n} turn(s)); free pages and WAL wiped")
