"""The judge candidates side by side: the LLM voter on the served model, the embedding voter, and
rules that combine them, on one labeled split, with the time and engine CPU a judged turn costs.

Each case gets m votes from each voter, exactly as the worker casts them (the LLM's m votes in one
request, ``n=m``); the per-case votes are saved, so every combination is scored on the same votes.
Combinations (each voter's majority first):

- ``llm``: the LLM voter alone;
- ``veto``: the LLM's verdict, but +1 becomes 0 when the embedding voter says -1;
- ``agree+``: +1 only when both say +1; -1 when the LLM says -1; else 0;
- ``both``: a nonzero verdict only when both give it.

Choose on ``--split validation``. The held-out split is scored once per released voter: the script
asks for ``--release`` before it reads it, and the README's judge table counts those looks.

    .venv/bin/python bench/judge_candidates.py --llm-url http://127.0.0.1:8100 --split validation
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import psutil
from _env import ROOT  # noqa: F401  (sets up the environment)

from judge.eval.dataset import load_cases
from judge.eval.evaluate import Report, evaluate
from judge.voters import EmbeddingVoter, LLMVoter, Vote, majority

RULES = ("llm", "embedding", "veto", "agree+", "both")


def combine(rule: str, llm: int, emb: int) -> int:
    if rule == "llm":
        return llm
    if rule == "embedding":
        return emb
    if rule == "veto":
        return 0 if (llm == 1 and emb == -1) else llm
    if rule == "agree+":
        return 1 if (llm == 1 and emb == 1) else (-1 if llm == -1 else 0)
    if rule == "both":
        return llm if llm == emb else 0
    raise ValueError(rule)


def scored(rule: str, split: str, m: int, cases: list, llm_votes: list, emb_votes: list) -> Report:
    rep = Report(voter=rule, split=split, m=m)
    for case, lv, ev in zip(cases, llm_votes, emb_votes, strict=True):
        maj = lambda vs: majority([Vote(s) for s in vs])  # noqa: E731
        rep.gold.append(case.score)
        rep.pred.append(combine(rule, maj(lv), maj(ev)))
        rep.ids.append(case.id)
        rep.votes.append([])
    return rep


def engine_process(url: str) -> psutil.Process | None:
    """The process listening on the engine's port (its CPU time is the judge's cost)."""
    port = int(url.rstrip("/").rsplit(":", 1)[1].split("/")[0])
    for c in psutil.net_connections("tcp"):
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
            return psutil.Process(c.pid)
    return None


def cpu_seconds(proc: psutil.Process | None) -> float:
    if proc is None:
        return float("nan")
    procs = [proc, *proc.children(recursive=True)]
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llm-url", required=True, help="The engine (vLLM) serving the judge model.")
    ap.add_argument("--llm-model", default=None, help="Model name (default: the first of /v1/models).")
    ap.add_argument("--split", default="validation", choices=("validation", "heldout", "train"))
    ap.add_argument("--votes", type=int, default=3, help="m")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--stride", type=int, default=1, help="Every K-th case only.")
    ap.add_argument("--release", action="store_true", help="Required to read the held-out split.")
    ap.add_argument("--out", default=None, help="Write figures and per-case votes as JSON here.")
    args = ap.parse_args()
    if args.split == "heldout" and not args.release:
        ap.error("the held-out split is read once per released voter: pass --release to do it")

    cases = load_cases(args.split)[:: args.stride]
    user = [c for c in cases if c.inp.role == "user"]
    emb = evaluate(EmbeddingVoter(), cases, args.votes, args.split)
    llm_voter = LLMVoter(args.llm_url, args.llm_model, args.temperature, max_tokens=args.max_tokens)
    proc = engine_process(args.llm_url)
    cpu0, t0 = cpu_seconds(proc), time.perf_counter()
    llm = evaluate(llm_voter, cases, args.votes, args.split)
    wall, cpu = time.perf_counter() - t0, cpu_seconds(proc) - cpu0
    per_turn = {"wall_s": wall / max(len(user), 1), "engine_cpu_s": cpu / max(len(user), 1),
                "votes_per_s": args.votes * len(user) / wall, "failed_votes": llm.failed_votes}
    out = {"split": args.split, "n": len(cases), "m": args.votes, "temperature": args.temperature,
           "model": llm_voter.model, "cost_per_user_turn": per_turn, "rules": {}}
    print(f"split={args.split} n={len(cases)} m={args.votes} T={args.temperature} model={llm_voter.model}")
    print(f"LLM cost per judged user turn: {per_turn['wall_s']:.2f} s wall, {per_turn['engine_cpu_s']:.2f} "
          f"engine CPU-s, {per_turn['votes_per_s']:.2f} votes/s; failed votes {llm.failed_votes}/{llm.total_votes}")
    print(f"{'rule':<10} {'acc':>6} {'FPR':>6} {'FNR':>6}  recall good/neutral/bad")
    for rule in RULES:
        rep = scored(rule, args.split, args.votes, cases, llm.votes, emb.votes)
        d = rep.as_dict()
        out["rules"][rule] = {k: d[k] for k in ("accuracy", "fpr", "fnr", "precision", "recall")}
        rc = d["recall"]
        print(f"{rule:<10} {rep.accuracy:6.3f} {rep.fpr:6.3f} {rep.fnr:6.3f}  "
              f"{rc['good']}/{rc['neutral']}/{rc['bad']}")
    out["cases"] = [{"id": c.id, "gold": c.score, "llm": lv, "embedding": ev,
                     "raw": None} for c, lv, ev in zip(cases, llm.votes, emb.votes, strict=True)]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
