"""The agent benchmark through the real OpenClaw client: does the model use its tools when a task needs them, and only then?

Each task (clawproxy/simulate/agent_tasks.jsonl: question, read, write, command; train, validation,
heldout) runs as `openclaw agent exec --cwd WS --json "task"` in a fresh scratch workspace holding
the task's files (always at the same path, as a user's is: OpenClaw's system prompt holds it), against `clawproxy start --no-train --no-judge` (or a running proxy: --url) with
OpenClaw's `lean` profile (read, write, edit, exec). A program checks each outcome
(agent_tasks.check). From the turns the proxy recorded: tool calls by name, malformed calls
(agent_tasks.malformed) and how each answer finished (stop, length, tool_calls).

    .venv/bin/python bench/agent.py --split heldout --out bench/results/agent-heldout.jsonl
    .venv/bin/python bench/agent.py --url http://127.0.0.1:8080 --data-dir clawproxy-data --category read --limit 2
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from _env import ROOT, reserve_port
from openclaw_models import wait_ready

from clawproxy.simulate.agent_tasks import (
    CATEGORIES,
    SPLITS,
    Outcome,
    Task,
    call_names,
    check,
    load_tasks,
    malformed,
    materialize,
)


def last_turn_id(db: Path) -> int:
    from clawproxy.store import Store

    store = Store.reader(db)
    try:
        return store.last_ids()["turn"]
    finally:
        store.close()


def user_text(messages: Any) -> str:
    """The text of a recorded request's user messages (string or content-part form)."""
    parts = []
    for m in messages or []:
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            parts += [c] if isinstance(c, str) else [p.get("text", "") for p in c or [] if isinstance(p, dict)]
    return "\n".join(p for p in parts if isinstance(p, str))


def task_turns(db: Path, after_id: int, prompt: str) -> list[dict[str, Any]]:
    """The recorded main turns after ``after_id`` whose conversation holds ``prompt`` (a reused
    proxy may record other traffic meanwhile)."""
    from clawproxy.store import Store

    store = Store.reader(db)
    try:
        out, last = [], after_id
        while page := store.turns_page(None, last, 200):
            last = page[-1]["id"]
            out += [t for t in page if t["kind"] == "main" and prompt in user_text(t["request_messages"])]
        return out
    finally:
        store.close()


def settled_turns(db: Path, after_id: int, prompt: str, wait_s: float = 15) -> list[dict[str, Any]]:
    """The task's turns once the recorder has written them: the same count twice, 2 s apart."""
    deadline, prev = time.monotonic() + wait_s, None
    while True:
        turns = task_turns(db, after_id, prompt)
        if (prev is not None and len(turns) == len(prev) and turns) or time.monotonic() > deadline:
            return turns
        prev = turns
        time.sleep(2)


def keep(ws: Path, done: Path, name: str) -> Path:
    """Move a finished workspace to ``done/name``, or ``name.2``, ``.3``...: a task measured again
    (every point of bench/agent_learn.py) must not land inside, or on, its earlier run."""
    dest, n = done / name, 1
    while dest.exists():
        n += 1
        dest = done / f"{name}.{n}"
    shutil.move(ws, dest)
    return dest


def run_task(task: Task, openclaw, home: Path, cfg_path: Path, db: Path, scratch: Path,
             timeout_s: int) -> dict[str, Any]:
    # One workspace path for every task: OpenClaw writes the path into its system prompt, so a path per
    # task would make each task prefill ~1.9k tokens afresh instead of reusing vLLM's prefix cache.
    ws = scratch / "workspace"
    (scratch / "done").mkdir(parents=True, exist_ok=True)
    if ws.exists():
        keep(ws, scratch / "done", f"before-{task.id}")
    materialize(task, ws)
    after = last_turn_id(db)
    t0 = time.monotonic()
    # The client directly, not openclaw.run: a failed or timed-out run still prints its JSON envelope.
    r = subprocess.run([str(openclaw.bin), "agent", "exec", "--config", str(cfg_path), "--cwd", str(ws),
                        "--timeout", str(timeout_s), "--json", task.prompt], capture_output=True, text=True,
                       timeout=timeout_s + 120, env=openclaw.env(home, cfg_path), cwd=home)
    wall = time.monotonic() - t0
    start = r.stdout.find("{")
    try:
        env = json.loads(r.stdout[start:]) if start >= 0 else {}
    except ValueError:
        env = {}
    turns = settled_turns(db, after, task.prompt)
    names = [n for t in turns for n in call_names(t)]
    summary = env.get("toolSummary") or {}
    # What the proxy recorded is the truth; OpenClaw's own summary covers a run the store missed.
    called = names if turns else list(summary.get("tools") or [])
    verdict = check(task, Outcome(env.get("final") or "", called, ws))
    keep(ws, scratch / "done", task.id)  # kept for a look at what the agent did
    bad = [{"turn_id": t["id"], "why": why} for t in turns if (why := malformed(t))]
    return {
        "id": task.id, "split": task.split, "kind": task.category, "ok": verdict.ok, "why": verdict.why,
        "status": env.get("status") or f"exit {r.returncode}", "final": (env.get("final") or "")[:400],
        "tool_calls": called, "openclaw_tool_calls": summary.get("calls"), "tool_failures": summary.get("failures"),
        "malformed": bad, "finish_reasons": [t["finish_reason"] for t in turns],
        "answer_finish": turns[-1]["finish_reason"] if turns else None, "turns": len(turns),
        "turn_ids": [t["id"] for t in turns],
        "wall_s": round(wall, 1),
        **({"error": (env.get("error") or {}).get("message") or r.stderr[-500:]} if not env.get("ok") else {}),
    }


def run_tasks(tasks: list[Task], openclaw, home: Path, cfg_path: Path, db: Path, scratch: Path, timeout_s: int,
              workers: int = 1, on_row: Callable[[int, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """``run_task`` over ``tasks``, ``workers`` at a time; rows in the tasks' order. vLLM batches the
    concurrent requests, and a CPU decode step costs nearly the same for two sequences as for one."""
    if workers <= 1:
        rows = []
        for i, task in enumerate(tasks, 1):
            rows.append(run_task(task, openclaw, home, cfg_path, db, scratch, timeout_s))
            if on_row:
                on_row(i, rows[-1])
        return rows
    slots: queue.Queue[Path] = queue.Queue()
    for k in range(workers):
        slots.put(scratch / f"w{k}")  # one fixed workspace path a worker, so each keeps its prompt prefix cached
    done, lock = iter(range(1, len(tasks) + 1)), threading.Lock()  # on_row is called one at a time

    def one(task: Task) -> dict[str, Any]:
        slot = slots.get()
        try:
            row = run_task(task, openclaw, home, cfg_path, db, slot, timeout_s)
        finally:
            slots.put(slot)
        if on_row:
            with lock:
                on_row(next(done), row)
        return row

    pool = ThreadPoolExecutor(workers)
    try:
        return list(pool.map(one, tasks))
    finally:  # on an interrupt, drop the tasks not yet started rather than run them all first
        pool.shutdown(wait=False, cancel_futures=True)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per task category (the rows' "kind"): success, tool calls (by name), malformed calls, how
    answers finished, wall time."""
    out: dict[str, Any] = {}
    for category in CATEGORIES:
        rs = [r for r in rows if r["kind"] == category]
        if not rs:
            continue
        walls = [r["wall_s"] for r in rs]
        out[category] = {
            "tasks": len(rs), "success": round(sum(r["ok"] for r in rs) / len(rs), 3),
            "tool_calls": sum(len(r["tool_calls"]) for r in rs),
            "tool_calls_by_name": dict(Counter(n for r in rs for n in r["tool_calls"])),
            "tasks_with_tool_calls": sum(bool(r["tool_calls"]) for r in rs),
            "malformed": sum(len(r["malformed"]) for r in rs),
            "answer_finish": dict(Counter(str(r["answer_finish"]) for r in rs)),
            "turn_finish": dict(Counter(str(f) for r in rs for f in r["finish_reasons"])),
            "wall_s_mean": round(sum(walls) / len(walls), 1), "wall_s_max": max(walls),
        }
    return out


def print_table(summary: dict[str, Any]) -> None:
    print(f"{'kind':<9} {'n':>3} {'success':>8} {'calls':>6} {'malformed':>9} {'stop':>5} {'length':>6} "
          f"{'wall s':>7}  calls by tool")
    for category, s in summary.items():
        fin = s["answer_finish"]
        print(f"{category:<9} {s['tasks']:>3} {s['success']:>8.2f} {s['tool_calls']:>6} {s['malformed']:>9} "
              f"{fin.get('stop', 0):>5} {fin.get('length', 0):>6} {s['wall_s_mean']:>7.1f}  "
              f"{json.dumps(s['tool_calls_by_name'])}")


def start_proxy(args, tmp: Path) -> tuple[subprocess.Popen, str, Path]:
    port, engine_port = reserve_port(), reserve_port()
    data = tmp / "data"
    # No trainer (the weights must not move mid-benchmark), no judge (its CPU time would slow the engine).
    cmd = [sys.executable, "-m", "clawproxy.cli", "start", "--no-train", "--no-judge", "--port", str(port),
           "--engine-port", str(engine_port), "--data-dir", str(data), "--engine", args.engine]
    if args.model:
        cmd += ["--model", args.model]
    if args.quantization:
        cmd += ["--quantization", args.quantization]
    proc = subprocess.Popen(cmd, stdout=open(tmp / "clawproxy.log", "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    return proc, f"http://127.0.0.1:{port}", data


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="heldout", choices=SPLITS)
    ap.add_argument("--category", "--kind", dest="category", action="append", choices=CATEGORIES,
                    help="only this task category (repeatable; default all; --kind is its old name)")
    ap.add_argument("--limit", type=int, default=None, help="at most N tasks of each category")
    ap.add_argument("--id", action="append", help="only this task id (repeatable)")
    ap.add_argument("--url", default=None, help="a running clawproxy to use instead of starting one")
    ap.add_argument("--data-dir", default="clawproxy-data",
                    help="with --url: that proxy's data dir, whose clawproxy.db holds the recorded turns")
    ap.add_argument("--model", default=None, help="model for clawproxy start (default: clawproxy's default)")
    ap.add_argument("--quantization", default=None, choices=["auto", "none", "w4a16"], help="clawproxy start --quantization")
    ap.add_argument("--engine", default="vllm", choices=["vllm", "embedded"])
    ap.add_argument("--profile", default="lean", choices=["lean", "default", "chat"], help="OpenClaw prompt profile")
    ap.add_argument("--task-timeout", type=int, default=1800, help="OpenClaw's deadline for one task, seconds")
    ap.add_argument("--workers", type=int, default=1,
                    help="tasks run at once (each in its own fixed workspace); vLLM batches them")
    ap.add_argument("--out", default=None, help="write one JSON line per task, then the summary, to this file")
    args = ap.parse_args(argv)
    if args.url and (args.model or args.quantization):
        ap.error("--model and --quantization start a proxy; with --url the running one serves as it is")

    tasks = load_tasks(split=args.split, categories=tuple(args.category) if args.category else None)
    if args.id:
        tasks = [t for t in tasks if t.id in args.id]
    if args.limit is not None:
        tasks = [t for c in CATEGORIES for t in [t for t in tasks if t.category == c][: args.limit]]
    if not tasks:
        raise SystemExit("no task matches --split/--category/--id")

    from click.testing import CliRunner

    from clawproxy.cli import main as cli
    from tests.net import stop
    from tests.openclaw_client import ensure_openclaw

    openclaw = ensure_openclaw()
    tmp = Path(tempfile.mkdtemp(prefix="clawproxy-agent-"))
    proc = None
    if args.url:
        url, data = args.url.rstrip("/"), Path(args.data_dir)
    else:
        proc, url, data = start_proxy(args, tmp)
    out = open(args.out, "w") if args.out else None
    try:
        t0 = time.monotonic()
        wait_ready(url, proc, 1800)
        ready_s = round(time.monotonic() - t0, 1)
        home, u = tmp / "home", urlparse(url)
        cfg_path = home / ".openclaw" / "openclaw.json"
        r = CliRunner().invoke(cli, ["openclaw-config", "--host", u.hostname or "127.0.0.1", "--port", str(u.port or 80),
                                     "--write", "--profile", args.profile],
                               env={"OPENCLAW_CONFIG_PATH": str(cfg_path)})
        if r.exit_code:
            raise SystemExit(r.output)
        db = data / "clawproxy.db"

        def report(i: int, row: dict[str, Any]) -> None:
            print(f"[{i}/{len(tasks)}] {row['id']}: {'ok' if row['ok'] else 'FAIL'} ({row['why']}; "
                  f"{row['wall_s']} s, calls {row['tool_calls']})", file=sys.stderr, flush=True)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()

        t_run = time.monotonic()
        rows = run_tasks(tasks, openclaw, home, cfg_path, db, tmp / "ws", args.task_timeout, args.workers, report)
        run_s = round(time.monotonic() - t_run, 1)
        summary = {"summary": summarize(rows), "split": args.split, "profile": args.profile,
                   "model": args.model, "quantization": args.quantization, "url": args.url, "ready_s": ready_s,
                   "workers": args.workers, "run_s": run_s,
                   "load_avg": round(os.getloadavg()[0], 1)}
        if out:
            out.write(json.dumps(summary) + "\n")
        print_table(summary["summary"])
        return summary
    finally:
        if out:
            out.close()
        if proc is not None:
            stop(proc)


if __name__ == "__main__":
    main()
