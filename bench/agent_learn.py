"""Learning on the agent benchmark (issue 38, item 2): a simulated user gives train tasks through the
real OpenClaw client to a learning `clawproxy start`, reacts to each final answer, and held-out
success is measured every few interactions through the same proxy.

- One interaction is one train task (``agent_tasks.jsonl``, cycled in a seeded order) run as
  `openclaw agent exec --cwd WS --json` (bench/agent.py's ``run_task``), then the user's reaction
  (``clawproxy.simulate.agent_user``: praise or a complaint, from the task's program check) sent as
  the conversation's next user message: the recorded request, its answer and the reaction, with the
  session's headers, as OpenClaw sends a next message (16 tokens of answer: only the reaction
  matters). The judge reads tool results and the reaction as next states; the trainer trains.
- A measurement point first lets the pipeline settle (judge caught up, trainer's queue below a
  batch), then runs the held-out tasks with a second OpenClaw config made by `openclaw-config
  --no-learn`: routed to the same adapter, recorded, never judged or trained on.
- ``--oracle``: the judge is off and each task's main turns get the check's verdict (+1 / -1, the
  category's rule as the hint) once the reaction has linked, through the same store and trainer.

    .venv/bin/python bench/agent_learn.py --seed 0 --out bench/results/i38/learn-seed0
    .venv/bin/python bench/agent_learn.py --seed 0 --interactions 4 --eval-every 4 --eval-limit 1  # a smoke run
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _env import ROOT  # noqa: F401  (this checkout's code on sys.path)
from agent import last_turn_id, run_task, run_tasks, summarize

from clawproxy.errors import ClawproxyError
from clawproxy.httpjson import request_json
from clawproxy.simulate.agent_tasks import CATEGORIES, Verdict, load_tasks
from clawproxy.simulate.agent_user import ORACLE_HINTS, react, reaction_message
from clawproxy.simulate.system import System


def write_openclaw_config(home: Path, name: str, url: str, profile: str, *extra: str) -> Path:
    from click.testing import CliRunner

    from clawproxy.cli import main as cli

    path = home / ".openclaw" / name
    port = url.rsplit(":", 1)[1]
    r = CliRunner().invoke(cli, ["openclaw-config", "--host", "127.0.0.1", "--port", port, "--write",
                                 "--profile", profile, *extra], env={"OPENCLAW_CONFIG_PATH": str(path)})
    if r.exit_code:
        raise SystemExit(r.output)
    return path


def turns_by_id(store, ids: list[int]) -> list[dict[str, Any]]:
    if not ids:
        return []
    return store.query(f"SELECT * FROM turns WHERE id IN ({','.join('?' * len(ids))}) ORDER BY id", tuple(ids))


def send_reaction(proxy_url: str, final: dict[str, Any], reaction: str) -> int:
    """The user's next message in the task's conversation; returns the proxy's HTTP status."""
    msgs = list(final["request_messages"] or [])
    users = [m for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
    stamp = time.strftime("%a %Y-%m-%d %H:%M UTC", time.gmtime())
    body = {**(final["request_params"] or {}), "messages": [
        *msgs, {"role": "assistant", "content": final["response_text"] or ""},
        reaction_message(reaction, users[-1] if users else {}, stamp)]}
    body.pop("max_tokens", None)
    body["max_completion_tokens"] = 16  # OpenClaw's answer to the reaction is not measured
    if final.get("request_tools"):
        body["tools"] = final["request_tools"]
    sid = final["session_id"]
    headers = {"session_id": sid, "x-session-affinity": sid}
    try:
        request_json("POST", f"{proxy_url}/v1/chat/completions", body, headers=headers, timeout=1800)
    except ClawproxyError as e:
        return e.status
    return 200


def wait_linked(store, turn_id: int, timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = store.query("SELECT next_state_role FROM turns WHERE id=?", (turn_id,))
        if row and row[0]["next_state_role"]:
            return True
        time.sleep(0.5)
    return False


def settle(view, batch_size: int, timeout_s: float = 900, stall_s: float = 240) -> dict[str, int]:
    """Wait until the judge has scored every trainable turn and the trainer's queue is below a batch."""
    store = view.store
    deadline, last, changed = time.monotonic() + timeout_s, None, time.monotonic()
    while True:
        sessions = [s["id"] for s in store.list_sessions()]
        b = view.backlog(sessions)
        if b["unjudged"] == 0 and b["unconsumed"] < batch_size:
            return b
        if b != last:
            last, changed = b, time.monotonic()
        if time.monotonic() > deadline or time.monotonic() - changed > stall_s:
            print(f"pipeline not settled ({b}); measuring anyway", file=sys.stderr, flush=True)
            return b
        time.sleep(2)


def judge_table(store, interactions: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """The judge against the simulator: on the final answers (the reaction's meaning is the truth),
    and on tool-call turns split by whether the task passed."""
    out: dict[str, Counter] = {"answer": Counter(), "tool:task_ok": Counter(), "tool:task_failed": Counter()}
    for it in interactions:
        rows = turns_by_id(store, it["turn_ids"])
        scores = {j["turn_id"]: j["score"] for j in store.query(
            f"SELECT turn_id, score FROM judgments WHERE turn_id IN ({','.join('?' * len(rows))})",
            tuple(r["id"] for r in rows))} if rows else {}
        for r in rows:
            s = scores.get(r["id"])
            if r["finish_reason"] == "tool_calls":
                key = "tool:task_ok" if it["ok"] else "tool:task_failed"
                out[key]["unjudged" if s is None else {1: "+1", 0: "0", -1: "-1"}[s]] += 1
            elif r["id"] == it["final_turn_id"]:
                out["answer"]["unjudged" if s is None else "zero" if s == 0
                              else "right" if s == it["intended"] else "wrong"] += 1
    return {k: dict(v) for k, v in out.items()}


def samples(store, interactions: list[dict[str, Any]]) -> dict[str, int]:
    ids = [i for it in interactions for i in it["turn_ids"]]
    fates = store.training_fate(ids) if ids else {}
    c = Counter()
    for r in turns_by_id(store, ids):
        f = fates[r["id"]]
        c[f"trained:{f['objective']}" if f["objective"] is not None else f"skipped:{f['skipped']}" if f["skipped"]
          else f"not_trainable:{r['reason']}" if not r["trainable"] else "waiting"] += 1
    return dict(sorted(c.items()))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--interactions", type=int, default=36)
    ap.add_argument("--eval-every", type=int, default=12)
    ap.add_argument("--eval-split", default="heldout", choices=["heldout", "validation"])
    ap.add_argument("--eval-limit", type=int, default=None, help="at most N measured tasks of each category")
    ap.add_argument("--oracle", action="store_true", help="the check's verdict as the reward (judge off)")
    ap.add_argument("--profile", default="lean", choices=["lean", "default", "chat"])
    ap.add_argument("--config", default=None, help="clawproxy config (default configs/default.yaml)")
    ap.add_argument("--task-timeout", type=int, default=1800)
    ap.add_argument("--eval-workers", type=int, default=2,  # 4 tasks: 303 s on 2 against 372 s on 1 (bench/results/i38)
                    help="held-out tasks run at once at each point (vLLM batches them; the learning tasks run one by one)")
    ap.add_argument("--out", required=True, help="directory for points.jsonl, interactions.jsonl, result.json")
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    train = load_tasks(split="train")
    random.Random(args.seed).shuffle(train)
    held = load_tasks(split=args.eval_split)
    if args.eval_limit is not None:
        held = [t for c in CATEGORIES for t in [t for t in held if t.category == c][: args.eval_limit]]
    rng = random.Random(args.seed)

    from clawproxy.simulate.run import StoreView
    from tests.openclaw_client import ensure_openclaw

    openclaw = ensure_openclaw()
    tmp = Path(tempfile.mkdtemp(prefix="clawproxy-agent-learn-"))
    system = System(tmp / "data", {"judge.enabled": False} if args.oracle else {}, args.config)
    t0 = time.monotonic()
    system.start(timeout_s=1800)
    print(f"clawproxy ready in {time.monotonic() - t0:.0f} s (data: {system.data_dir})", file=sys.stderr, flush=True)
    view = StoreView(system.data_dir)
    store = view.store
    home = tmp / "home"
    learn_cfg = write_openclaw_config(home, "learn.json", system.proxy_url, args.profile)
    measure_cfg = write_openclaw_config(home, "measure.json", system.proxy_url, args.profile, "--no-learn")
    db = system.data_dir / "clawproxy.db"
    points, interactions = [], []
    pf, itf = open(out / "points.jsonl", "w"), open(out / "interactions.jsonl", "w")
    try:
        def measure(done: int) -> None:
            ts = time.monotonic()
            backlog = settle(view, system.config.trainer.batch_size)
            rows = run_tasks(held, openclaw, home, measure_cfg, db, tmp / "ms", args.task_timeout, args.eval_workers)
            versions = [v["weight_version"] for r in rows for v in turns_by_id(store, r["turn_ids"])
                        if v["weight_version"] is not None]
            point = {"interactions": done, "summary": summarize(rows), "weight_version": max(versions, default=None),
                     "rows": rows, "settled": backlog, "measure_s": round(time.monotonic() - ts, 1),
                     "wall_s": round(time.monotonic() - t0, 1)}
            points.append(point)
            pf.write(json.dumps(point) + "\n")
            pf.flush()
            line = ", ".join(f"{k} {s['success']:.2f}" for k, s in point["summary"].items())
            print(f"[point {done}] {line} (weights v{point['weight_version']}, {point['measure_s']} s)",
                  file=sys.stderr, flush=True)

        def stop(*_: object) -> None:
            raise KeyboardInterrupt

        # SIGTERM (a session's end, `kill`) ends the run early; what was measured is still written below
        signal.signal(signal.SIGTERM, stop)
        stopped_early = False
        try:
            measure(0)
            for i in range(args.interactions):
                task = train[i % len(train)]
                row = run_task(task, openclaw, home, learn_cfg, db, tmp / "ws", args.task_timeout)
                turns = turns_by_id(store, row["turn_ids"])
                final = turns[-1] if turns and turns[-1]["finish_reason"] == "stop" else None
                reaction, intended = react(task, Verdict(row["ok"], row["why"]), rng)
                status, linked = None, False
                if final is not None:
                    status = send_reaction(system.proxy_url, final, reaction)
                    linked = wait_linked(store, final["id"])
                if args.oracle:
                    for t in turns_by_id(store, row["turn_ids"]):
                        if wait_linked(store, t["id"], 10):
                            store.add_judgment(t["id"], intended, None if row["ok"] else ORACLE_HINTS[task.category], "oracle")
                it = {"i": i + 1, "id": task.id, "kind": task.category, "ok": row["ok"], "why": row["why"],
                      "tool_calls": row["tool_calls"], "malformed": row["malformed"], "reaction": reaction,
                      "intended": intended, "reaction_status": status, "linked": linked,
                      "final_turn_id": final["id"] if final else None, "turn_ids": row["turn_ids"],
                      "wall_s": row["wall_s"]}
                interactions.append(it)
                itf.write(json.dumps(it) + "\n")
                itf.flush()
                print(f"[{i + 1}/{args.interactions}] {task.id}: {'ok' if row['ok'] else 'FAIL'} -> {reaction!r}"
                      f"{'' if linked else ' (reaction not linked)'}", file=sys.stderr, flush=True)
                if (i + 1) % args.eval_every == 0 or i + 1 == args.interactions:
                    measure(i + 1)
        except KeyboardInterrupt:
            stopped_early = True
            print(f"stopped after {len(interactions)} interactions; writing what was measured",
                  file=sys.stderr, flush=True)
        result = {
            "seed": args.seed, "oracle": args.oracle, "profile": args.profile, "eval_split": args.eval_split,
            "stopped_early": stopped_early,
            "curve": [{"interactions": p["interactions"], "weight_version": p["weight_version"],
                       **{k: s["success"] for k, s in p["summary"].items()}} for p in points],
            "judge": judge_table(store, interactions), "samples": samples(store, interactions),
            "train_ok_rate": round(sum(it["ok"] for it in interactions) / max(len(interactions), 1), 3),
            "wall_s": round(time.monotonic() - t0, 1), "last_turn": last_turn_id(db),
        }
        (out / "result.json").write_text(json.dumps(result, indent=1))
        print(json.dumps({k: result[k] for k in ("curve", "judge", "samples", "wall_s")}, indent=1))
        return result
    finally:
        pf.close()
        itf.close()
        view.close()
        system.stop()


if __name__ == "__main__":
    main()
