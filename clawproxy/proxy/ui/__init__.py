"""The dashboard, ``/clawproxy/ui``: served by the proxy beside its other control endpoints.

- Server-rendered with aiohttp-jinja2 from ``templates/``; ``static/`` holds the page script, the
  style sheet and Chart.js 4.6.1 (``chart.umd.js`` from the npm tarball, with its license), so
  nothing is fetched at run time and there is no build step.
- Access is the proxy's control guard (``clawproxy/edge.py``), Host check included. Every action
  (POST) must carry this process's CSRF token, which the pages embed, and come from a page of the
  same origin (``Origin`` or ``Sec-Fetch-Site``); otherwise the answer is 403.
- The proxy's requests never wait on a page: every read goes through a read-only store connection
  (``Store.reader``) on the dashboard's own thread, off the event loop.
- Rollback runs ``clawproxy rollback`` itself as a child process, so it is exactly the CLI's code
  path, and the trainer (and torch) stay out of the proxy process.
- Live updates: the pages poll ``/clawproxy/ui/api/live`` (a few ids and counters) and fetch more
  only when something changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp_jinja2
import jinja2
import orjson
from aiohttp import web

from clawproxy.config import Config
from clawproxy.edge import check_control, error_response, query_int, same_origin, same_secret
from clawproxy.errors import ClawproxyError, Forbidden, NotFound, RequestError, StoreError
from clawproxy.openclaw import last_user_text
from clawproxy.simulate.measure import adoption_curves
from clawproxy.store import Store
from clawproxy.store.preferences import shown_preferences
from clawproxy.turn_view import turn_view

log = logging.getLogger("clawproxy.ui")
HERE = Path(__file__).parent
STATIC = HERE / "static"
PREFIX = "/clawproxy/ui"
SCORE_BUCKET_S = 3600.0  # the score-over-time chart: one point per hour
ROLLBACK_TIMEOUT_S = 300.0
LIVE_TURNS = 20
MEMORY_ROWS = 100  # a user's newest reactions on the memory page


@dataclass
class Dashboard:
    """The dashboard's state: its config, its CSRF token, its one reader thread and the
    read-only store connection that thread owns."""

    cfg: Config
    recording: Callable[[], dict[str, Any]]
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="clawproxy-ui"))
    reader: Store | None = None
    # The running `clawproxy rollback`: owned here, not by the request, so a closed tab cannot
    # cut it short between the engine's reload and the store's record; cleanup awaits it.
    rollback_task: asyncio.Task[tuple[bool, str]] | None = None

    async def read(self, fn: Callable[[Store], Any]) -> Any:
        """``fn(store)`` on the reader thread (the store opened read-only on first use)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._read, fn)

    def _read(self, fn: Callable[[Store], Any]) -> Any:
        if self.reader is None:
            if not self.cfg.db_path.exists():
                raise StoreError(f"no store at {self.cfg.db_path} yet: nothing recorded so far.")
            self.reader = Store.reader(self.cfg.db_path)
        return fn(self.reader)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None


UI_KEY = web.AppKey("clawproxy_ui", Dashboard)


def setup(app: web.Application, cfg: Config, recording: Callable[[], dict[str, Any]]) -> None:
    """Add the dashboard's routes to the proxy ``app`` (before its catch-all route).

    Access is the proxy's control guard (``clawproxy/edge.py``); ``recording()``: the recorder's counters.
    """
    env = aiohttp_jinja2.setup(app, loader=jinja2.PackageLoader("clawproxy.proxy.ui", "templates"),
                               autoescape=jinja2.select_autoescape(["html"]))
    env.filters["ts"] = _ts
    env.filters["num"] = _num
    app[UI_KEY] = Dashboard(cfg, recording)
    app.cleanup_ctx.append(_ctx)
    r = app.router
    r.add_get(PREFIX, to_overview)
    r.add_get(PREFIX + "/", overview)
    r.add_get(PREFIX + "/sessions", sessions)
    r.add_get(PREFIX + "/sessions/{sid:.+}", session)  # session ids may hold a "/"
    r.add_get(PREFIX + "/learning", learning)
    r.add_get(PREFIX + "/memory", memory)
    r.add_get(PREFIX + "/versions", versions)
    r.add_post(PREFIX + "/versions/rollback", rollback)
    r.add_get(PREFIX + "/api/live", api_live)
    r.add_get(PREFIX + "/api/learning", api_learning)
    r.add_get(PREFIX + "/static/{name}", static)


async def _ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    ui = app[UI_KEY]
    if ui.rollback_task is not None:
        with contextlib.suppress(Exception):
            await ui.rollback_task
    await asyncio.get_running_loop().run_in_executor(ui.executor, ui.close)
    ui.executor.shutdown(wait=True)


# -- access ---------------------------------------------------------------------------------------
def guarded(handler: Callable[[web.Request], Any]) -> Callable[[web.Request], Any]:
    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            p = request.app[UI_KEY].cfg.proxy
            check_control(request, p.control_token, "proxy.control_token", p.host_names)
        except ClawproxyError as err:
            return error_response(err)
        try:
            return await handler(request)
        except RequestError as e:
            return error_response(e)
        except StoreError as e:
            return _page(request, "error.html", {"message": e.message}, status=503)
        except sqlite3.Error as e:  # a read that failed (disk, I/O): the page says so, the proxy goes on
            return _page(request, "error.html", {"message": f"reading the store failed: {e}"}, status=503)
        except web.HTTPException as e:
            if e.status < 400:
                raise  # a redirect the handler chose
            # aiohttp's own refusals (a form over client_max_size...) in the proxy's JSON
            cls = RequestError if e.status < 500 else ClawproxyError
            return error_response(cls(e.text or e.reason, status=e.status))
        except Exception:  # a bug of ours: logged with its traceback, the client gets JSON
            log.exception("dashboard error on %s %s", request.method, request.path)
            return error_response(ClawproxyError("internal dashboard error; see the clawproxy log"))

    wrapped.__name__ = handler.__name__
    return wrapped


def _csrf_ok(request: web.Request, form: Any) -> bool:
    sent = form.get("csrf") or request.headers.get("X-CSRF-Token") or ""
    return same_secret(str(sent), request.app[UI_KEY].csrf)


def _page(request: web.Request, template: str, ctx: dict[str, Any], status: int = 200) -> web.Response:
    ui = request.app[UI_KEY]
    base = {"csrf": ui.csrf, "prefix": PREFIX, "page": template.split(".")[0],
            "poll_ms": 2000}
    resp = aiohttp_jinja2.render_template(template, request, {**base, **ctx}, status=status)
    resp.headers["Cache-Control"] = "no-store"
    # The pages load only our own script and style: no inline script runs, no frame embeds us.
    resp.headers["Content-Security-Policy"] = (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'")
    resp.headers["X-Frame-Options"] = "DENY"
    return resp


def _json(obj: Any) -> web.Response:
    return web.Response(body=orjson.dumps(obj), content_type="application/json",
                        headers={"Cache-Control": "no-store"})


# -- pages ----------------------------------------------------------------------------------------
@guarded
async def to_overview(_request: web.Request) -> web.Response:
    raise web.HTTPFound(PREFIX + "/")


@guarded
async def overview(request: web.Request) -> web.Response:
    ui = request.app[UI_KEY]
    rec = ui.recording()
    data = await ui.read(lambda s: _overview(s, ui.cfg))
    health = {"spool_records": rec["spool_records"], "quarantined": data.pop("quarantined"),
              "turns_lost": rec["turns_lost"], "store_ok": rec["store_ok"],
              "last_error": rec["last_error"], "queue_depth": rec["queue_depth"]}
    return _page(request, "overview.html", {**data, "health": health})


def _midnight() -> float:
    lt = time.localtime()
    return time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, 0, 0, 0, 0, 0, -1))


def _overview(s: Store, cfg: Config) -> dict[str, Any]:
    serving = s.serving_checkpoint()
    return {
        "serving": {"version": serving["version"], "published_at": serving["created_at"]}
        if serving else {"version": 0, "published_at": None},
        "today": s.turns_and_sessions_since(_midnight()),
        "judge": _judge_state(s, cfg),
        "verdicts": s.judge_summary(),
        "trainer": _trainer_state(s, cfg),
        "skipped": sorted(s.skipped_by_reason().items(), key=lambda kv: -kv[1]),
        "quarantined": s.quarantine_count(),
        "recent": s.turns_after(0, LIVE_TURNS),
        "ids": s.last_ids(),
    }


def _judge_state(s: Store, cfg: Config) -> dict[str, str]:
    p = s.judge_backlog()
    if not cfg.judge.enabled:
        return {"state": "off", "detail": f"judge.enabled is false; {p['judged']} turns judged before"}
    if p["pending"]:
        return {"state": "judging", "detail": f"{p['pending']} turn(s) waiting for votes, {p['judged']} judged"}
    last = f", the last at {_ts(p['last_at'])}" if p["last_at"] else ""
    return {"state": "waiting for turns", "detail": f"every turn with a next state is judged ({p['judged']}{last})"}


def _trainer_state(s: Store, cfg: Config) -> dict[str, str]:
    """Derived from the store: the newest step, the newest trainer error, the judged backlog."""
    bs = cfg.trainer.batch_size
    if not cfg.trainer.enabled:
        return {"state": "off", "detail": "trainer.enabled is false (or --no-train)"}
    last = s.last_step()
    err = s.last_event(["trainer_error"])
    if err and (last is None or err["ts"] > last["created_at"]):
        return {"state": "error", "detail": str((err["data"] or {}).get("error", "?"))[:300]}
    ready = s.untrained_judged_count()
    if ready >= bs:
        return {"state": "training", "detail": f"{ready} judged sample(s) ready, batch size {bs}"}
    if last is not None and last["status"] == "gate_failed":
        failed = ", ".join(((last["metrics"] or {}).get("gate") or {}).get("failed", [])) or "?"
        return {"state": "gate refused", "detail": f"step {last['id']} from v{last['base_version']}: {failed}"}
    done = f"; last step {last['id']} {last['status']} at {_ts(last['created_at'])}" if last else ""
    return {"state": "waiting for samples", "detail": f"{ready}/{bs} judged sample(s) ready{done}"}


@guarded
async def sessions(request: web.Request) -> web.Response:
    q = request.query
    trainable = {"yes": True, "no": False}.get(q.get("trainable", ""))
    score = q.get("score") if q.get("score") in ("pos", "neg", "zero", "none") else None
    user = q.get("user") or None

    def read(s: Store) -> dict[str, Any]:
        return {"sessions": s.list_sessions(500, trainable=trainable, score=score, user=user), **_of_user(s, user)}

    data = await request.app[UI_KEY].read(read)
    return _page(request, "sessions.html", {**data, "trainable": q.get("trainable", ""), "score": score or ""})


def _of_user(s: Store, user: str | None) -> dict[str, Any]:
    """The page's user picker: every user's name and the one chosen (None: everyone); an unknown name is a 404."""
    names = s.user_names()
    if user is not None and user not in names:
        raise NotFound(f"no user {user!r}" + (f" (users: {', '.join(names)})" if names else ": this proxy has no users"))
    return {"users": names, "user": user}


@guarded
async def session(request: web.Request) -> web.Response:
    sid = request.match_info["sid"]

    def read(s: Store) -> dict[str, Any] | None:
        sess = s.get_session(sid)
        if sess is None:
            return None
        turns = s.session_turns(sid)
        ids = [t["id"] for t in turns]
        votes = s.votes_of(ids) if ids else {}
        fate = s.training_fate(ids) if ids else {}
        views = []
        for t in turns:
            v = turn_view(t, fate[t["id"]]["step"], fate[t["id"]]["skipped"])
            v["votes"] = votes[t["id"]]
            views.append(v)
        return {"session": sess, "turns": views}

    data = await request.app[UI_KEY].read(read)
    if data is None:
        return _page(request, "error.html", {"message": f"no session {sid!r}"}, status=404)
    return _page(request, "session.html", data)


@guarded
async def learning(request: web.Request) -> web.Response:
    ui = request.app[UI_KEY]
    user = request.query.get("user") or None
    data = await ui.read(lambda s: {**_of_user(s, user), **_learning(s, ui.cfg, user)})
    pick = {"users": data.pop("users"), "user": data.pop("user")}
    # Inside <script> only "</" could end the element: "<" is escaped the way JSON allows.
    data_json = orjson.dumps(data).decode().replace("<", "\\u003c")
    return _page(request, "learning.html", {"data": data, "data_json": data_json, **pick})


@guarded
async def memory(request: web.Request) -> web.Response:
    """What a user told the model: their reactions the judge scored, in their own words."""
    ui = request.app[UI_KEY]
    user = request.query.get("user") or None

    def read(s: Store) -> dict[str, Any]:
        pick = _of_user(s, user)
        rows = [{**r, "about": last_user_text(r["request_messages"] or [])[:300]}
                for r in s.reactions_of(user, limit=MEMORY_ROWS)]
        prefs = shown_preferences(s.preferences_of(user, ("active", "candidate", "demoted")), ui.cfg.trying.apply)
        return {**pick, "reactions": rows, "counts": s.reaction_counts(user),
                "verdicts": s.judge_summary(user, all_users=False), "preferences": prefs,
                "trying": s.trying_counts(user)}

    return _page(request, "memory.html", await ui.read(read))


@guarded
async def api_learning(request: web.Request) -> web.Response:
    ui = request.app[UI_KEY]
    user = request.query.get("user") or None

    def read(s: Store) -> dict[str, Any]:
        _of_user(s, user)
        return _learning(s, ui.cfg, user)

    return _json(await ui.read(read))


def _learning(s: Store, cfg: Config, user: str | None = None) -> dict[str, Any]:
    """The learning page's data: everyone's, or with ``user`` that user's turns, steps, rollbacks and curve."""
    rollbacks = [{"ts": r["ts"], **(r["data"] or {})} for r in s.events_of("rollback")
                 if user is None or (r["data"] or {}).get("user") == user]
    rolled = {r.get("new_version") for r in rollbacks}
    per_version = [{"v": r["v"] or 0, "mean": r["mean"], "judged": r["judged"], "rollback": (r["v"] or 0) in rolled}
                   for r in sorted(s.served_turns_per_version(user), key=lambda r: r["v"] or 0) if r["judged"]]
    steps = []
    for st in s.steps_with_samples(user):
        m = st["metrics"] or {}
        steps.append({"id": st["id"], "t": st["created_at"], "status": st["status"], "samples": st["samples"],
                      "loss": m.get("loss"), "kl": m.get("kl"), "clip_frac": m.get("clip_frac"),
                      "failed": (m.get("gate") or {}).get("failed", []) if st["status"] == "gate_failed" else []})
    for r in rollbacks:  # drawn between the steps it came after and before
        r["after_step"] = sum(1 for st in steps if st["t"] <= r["ts"])
    over_time = [{"t": r["t"], "mean": r["mean"], "n": r["n"]}
                 for r in s.mean_score_over_time(SCORE_BUCKET_S, user)]
    return {"per_version": per_version, "over_time": over_time, "steps": steps, "rollbacks": rollbacks,
            "simulate": adoption_curves(cfg.data_path, user)}


@guarded
async def versions(request: web.Request) -> web.Response:
    """Every checkpoint, or with ``user`` that user's and the shared ones that served them; a rollback
    moves one adapter's chain (the shared one, or the chosen user's), so only its versions offer one."""
    user = request.query.get("user") or None

    def read(s: Store) -> dict[str, Any]:
        pick = _of_user(s, user)
        steps = {st["id"]: st for st in s.steps_with_samples(user)}
        current = s.latest_weight_version(user)
        # a user still served by the shared adapter has no chain of their own to move (as `clawproxy rollback`)
        movable = current != 0 and (user is None or s.serving_checkpoint(user) is not None)
        rows = [{"version": 0, "source": "base model", "status": "base", "created_at": None, "gate": None,
                 "user": None, "step": None, "rollback_ok": movable}]
        for c in s.checkpoints() if user is None else s.checkpoints_of(user):
            gate = c["gate"] or {}
            source = f"rollback to v{gate['rollback_of']}" if "rollback_of" in gate else f"step {c['step_id']}"
            rows.append({**c, "source": source, "step": steps.get(c["step_id"]),
                         "rollback_ok": c["status"] == "published" and c["version"] != current
                         and c["user"] == user})
        refused = [st for st in steps.values() if st["status"] != "published"]
        return {"versions": rows, "current": current, "refused": refused, **pick}

    data = await request.app[UI_KEY].read(read)
    q = request.query
    return _page(request, "versions.html", {**data, "done": q.get("done"), "error": q.get("error")})


@guarded
async def rollback(request: web.Request) -> web.Response:
    if not same_origin(request):
        return error_response(Forbidden("actions are taken only from the dashboard's own pages (the "
                                        "browser's Origin or Sec-Fetch-Site header says otherwise)",
                                        code="cross_origin"))
    form = await request.post()
    if not _csrf_ok(request, form):
        return error_response(Forbidden("missing or wrong CSRF token: reload the dashboard and try again",
                                        code="csrf"))
    version = form.get("version") or ""
    user = str(form.get("user") or "")
    if version and not str(version).isdigit():
        return _back(user, error=f"not a version: {version!r}")
    ui = request.app[UI_KEY]
    if ui.rollback_task is not None and not ui.rollback_task.done():
        return _back(user, error="a rollback is already running")
    ui.rollback_task = asyncio.create_task(_run_rollback(ui.cfg, str(version) or None, user or None),
                                           name="clawproxy-ui-rollback")
    ok, out = await asyncio.shield(ui.rollback_task)
    return _back(user, **({"done": out} if ok else {"error": out}))


def _back(user: str, **msg: str) -> web.Response:
    raise web.HTTPSeeOther(f"{PREFIX}/versions?{urlencode({**({'user': user} if user else {}), **msg})}")


async def _run_rollback(cfg: Config, version: str | None, user: str | None = None) -> tuple[bool, str]:
    """``clawproxy rollback [VERSION] [--user NAME]`` against this proxy's data dir and upstream: (ok, its last line)."""
    argv = [sys.executable, "-m", "clawproxy.cli", "rollback", *([version] if version else []),
            *(["--user", user] if user else []), "--data-dir", str(cfg.data_path)]
    run_config = cfg.data_path / "run-config.yaml"  # what `clawproxy start` gave its children
    if run_config.exists():
        argv += ["--config", str(run_config)]
    if cfg.proxy.upstream:
        argv += ["--engine-url", cfg.proxy.upstream]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), ROLLBACK_TIMEOUT_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return False, f"`clawproxy rollback` did not finish in {ROLLBACK_TIMEOUT_S:.0f} s"
    lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
    return proc.returncode == 0, (lines[-1] if lines else f"exit code {proc.returncode}")[:500]


@guarded
async def api_live(request: web.Request) -> web.Response:
    """What changed: the newest ids, today's counters, the serving version and (``after``) the
    turns recorded since the turn id the page last saw."""
    after = query_int(request, "after", 0, ge=-1)  # -1: the page wants no turns

    def read(s: Store) -> dict[str, Any]:
        serving = s.serving_checkpoint()
        return {"ids": s.last_ids(), "today": s.turns_and_sessions_since(_midnight()),
                "serving": serving["version"] if serving else 0,
                "turns": s.turns_after(after, LIVE_TURNS) if after >= 0 else []}

    return _json(await request.app[UI_KEY].read(read))


@guarded
async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    path = STATIC / name
    if "/" in name or name.startswith(".") or not path.is_file():
        return error_response(NotFound(f"no static file {name!r} in the dashboard"))
    return web.FileResponse(path, headers={"Cache-Control": "max-age=3600"})


# -- template filters -----------------------------------------------------------------------------
def _ts(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _num(x: Any, fmt: str = "{:.4g}") -> str:
    return "-" if x is None else fmt.format(x)
