"""The judge candidates side by side: the LLM voter on the served model, the embedding voter, and
rules that combine them, on one labeled split, with the time and engine CPU a judged turn costs.

Each case gets m votes from each voter, exactly as the worker casts them (the LLM's m votes in one
request, ``n=m``); the per-case votes are saved, so every combination is scored on the same votes.
Combinations (each voter's majority first):

- ``llm``: the LLM voter alone;
- ``veto``: the LLM's verdict, but +1 becomes 0 when the embedding voter says -1;
- ``agree+``: +1 only when both say +1; -1 when the LLM says -1; else 0;
- ``both``: a nonzero verdict only when both give it.

``--probs``: also the LLM's probability of each score from one greedy step after ``Score:``
(``continue_final_message``, ``top_logprobs``), one request and one generated token per turn:
``probs`` says +1 when p(+1) >= ``--good``, -1 when p(-1) >= ``--bad``, else 0, and the thresholds
are swept on the split it reads (pick them on validation, then pass them for the held-out look);
``probs-both`` combines it with the embedding voter as ``both`` does. ``--system-prompt FILE``
replaces the voter's system prompt (bench/judge/prompt-v2.txt is the one tried on validation).

Choose on ``--split validation``. The held-out split is scored once per released voter: the script
asks for ``--release`` before it reads it, and bench/results/README.md's judge row counts those looks.

    .venv/bin/python bench/judge_candidates.py --llm-url http://127.0.0.1:8100 --split validation
"""

from __future__ import annotations

import argparse
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from _env import ROOT  # noqa: F401  (sets up the environment)

from clawproxy.httpjson import request_json
from judge.eval.dataset import load_cases
from judge.eval.evaluate import Report, evaluate
from judge.voters import EmbeddingVoter, LLMVoter, Vote, majority, render_prompt

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


_SIGN = {"+": 1, "<+": 1, "(+": 1, "+1": 1, "-": -1, "<-": -1, "(-": -1, "−": -1, "-1": -1,
         "": 0, "0": 0, "<0": 0, "(0": 0}  # the first token after "Score:", stripped


def score_probs(url: str, model: str, system: str | None, inp) -> dict[int, float] | None:
    """p(+1), p(0), p(-1) of the next token after ``Score:``; None for a tool turn (rule-judged)."""
    if inp.role == "tool":
        return None
    msgs = render_prompt(inp)
    if system:
        msgs[0] = {"role": "system", "content": system}
    body = {"model": model, "messages": [*msgs, {"role": "assistant", "content": "Score:"}],
            "max_tokens": 1, "temperature": 0, "logprobs": True, "top_logprobs": 20,
            "add_generation_prompt": False, "continue_final_message": True}
    out = request_json("POST", url.rstrip("/") + "/v1/chat/completions", body, timeout=600)
    mass = {1: 0.0, 0: 0.0, -1: 0.0}
    for t in out["choices"][0]["logprobs"]["content"][0]["top_logprobs"]:
        sign = _SIGN.get(t["token"].strip())
        if sign is not None:
            mass[sign] += math.exp(t["logprob"])
    z = sum(mass.values()) or 1.0
    return {k: v / z for k, v in mass.items()}


def decide(p: dict[int, float] | None, good: float, bad: float, tool_vote: int) -> int:
    if p is None:
        return tool_vote
    if p[1] >= good and p[1] >= p[-1]:
        return 1
    return -1 if p[-1] >= bad else 0


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
    ap.add_argument("--probs", action="store_true", help="Also score the LLM's score probabilities.")
    ap.add_argument("--good", type=float, default=0.8, help="probs: p(+1) needed for +1.")
    ap.add_argument("--bad", type=float, default=0.3, help="probs: p(-1) needed for -1.")
    ap.add_argument("--system-prompt", default=None, help="A file replacing the voter's system prompt.")
    ap.add_argument("--skip-sampled", action="store_true", help="Only the probs voter (with --probs).")
    ap.add_argument("--out", default=None, help="Write figures and per-case votes as JSON here.")
    args = ap.parse_args()
    if args.split == "heldout" and not args.release:
        ap.error("the held-out split is read once per released voter: pass --release to do it")

    cases = load_cases(args.split)[:: args.stride]
    user = [c for c in cases if c.inp.role == "user"]
    emb = evaluate(EmbeddingVoter(), cases, args.votes, args.split)
    llm_voter = LLMVoter(args.llm_url, args.llm_model, args.temperature, max_tokens=args.max_tokens)
    model = llm_voter._model_name()
    system = Path(args.system_prompt).read_text().strip() if args.system_prompt else None
    proc = engine_process(args.llm_url)
    out = {"split": args.split, "n": len(cases), "m": args.votes, "temperature": args.temperature,
           "model": model, "system_prompt": args.system_prompt, "cost_per_user_turn": {}, "rules": {}}
    print(f"split={args.split} n={len(cases)} m={args.votes} T={args.temperature} model={model}")

    def report(rule: str, pred: list[int]) -> None:
        rep = Report(voter=rule, split=args.split, m=args.votes, gold=[c.score for c in cases], pred=pred,
                     ids=[c.id for c in cases], votes=[[] for _ in cases])
        d = rep.as_dict()
        out["rules"][rule] = {k: d[k] for k in ("accuracy", "fpr", "fnr", "precision", "recall")}
        rc = d["recall"]
        print(f"{rule:<11} {rep.accuracy:6.3f} {rep.fpr:6.3f} {rep.fnr:6.3f}  {rc['good']}/{rc['neutral']}/{rc['bad']}")

    def cost(name: str, wall: float, cpu: float, votes: int) -> None:
        c = {"wall_s": wall / max(len(user), 1), "engine_cpu_s": cpu / max(len(user), 1),
             "votes_per_s": votes * len(user) / wall}
        out["cost_per_user_turn"][name] = c
        print(f"{name}: per judged user turn {c['wall_s']:.2f} s wall, {c['engine_cpu_s']:.2f} engine CPU-s")

    emb_maj = [majority([Vote(s) for s in vs]) for vs in emb.votes]
    if not args.skip_sampled:
        cpu0, t0 = cpu_seconds(proc), time.perf_counter()
        llm = evaluate(llm_voter, cases, args.votes, args.split)
        cost("llm (sampled, n=m)", time.perf_counter() - t0, cpu_seconds(proc) - cpu0, args.votes)
        print(f"failed votes {llm.failed_votes}/{llm.total_votes}")
        llm_maj = [majority([Vote(s) for s in vs]) for vs in llm.votes]
        print(f"{'rule':<11} {'acc':>6} {'FPR':>6} {'FNR':>6}  recall good/neutral/bad")
        for rule in RULES:
            report(rule, [combine(rule, a, b) for a, b in zip(llm_maj, emb_maj, strict=True)])
        out["cases_sampled"] = [{"id": c.id, "llm": lv, "embedding": ev}
                                for c, lv, ev in zip(cases, llm.votes, emb.votes, strict=True)]
    if args.probs:
        cpu0, t0 = cpu_seconds(proc), time.perf_counter()
        with ThreadPoolExecutor(4) as ex:  # vLLM batches them: one prefill each, no decode to speak of
            probs = list(ex.map(lambda c: score_probs(args.llm_url, model, system, c.inp), cases))
        cost("llm (probs)", time.perf_counter() - t0, cpu_seconds(proc) - cpu0, 1)
        tools = [majority([Vote(s) for s in vs]) for vs in emb.votes]  # tool turns: the rule, same in every voter
        grid = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
        sweep = []
        for good in grid:
            for bad in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6):
                pred = [decide(p, good, bad, t) for p, t in zip(probs, tools, strict=True)]
                rep = Report(voter="probs", split=args.split, m=1, gold=[c.score for c in cases], pred=pred,
                             ids=[c.id for c in cases], votes=[[] for _ in cases])
                sweep.append({"good": good, "bad": bad, "accuracy": round(rep.accuracy, 4), "fpr": round(rep.fpr, 4)})
        if args.split != "heldout":  # thresholds are chosen on validation: the held-out sweep is never shown
            best = max((r for r in sweep if r["fpr"] <= 0.05), key=lambda r: r["accuracy"], default=None)
            out["probs_sweep"] = sweep
            print(f"probs sweep on this split: best accuracy at FPR <= 0.05: {best}")
        pred = [decide(p, args.good, args.bad, t) for p, t in zip(probs, tools, strict=True)]
        print(f"probs at --good {args.good} --bad {args.bad}:")
        report("probs", pred)
        report("probs-both", [combine("both", a, b) for a, b in zip(pred, emb_maj, strict=True)])
        out["cases_probs"] = [{"id": c.id, "gold": c.score, "p": p and {str(k): round(v, 4) for k, v in p.items()}}
                              for c, p in zip(cases, probs, strict=True)]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
