"""Personalization benchmark: does talking to clawproxy teach the model a user's preference?

1. Oracle baseline (no judge, no proxy): bare REINFORCE on the default model with the preference
   check as the reward: full fine-tuning, AdamW lr 1e-5, batch 4, sampled answers of <= 160 tokens.
2. The full system: `clawproxy start` (proxy -> judge -> trainer -> hot reload) driven by the
   simulated persona through the proxy, for each --method.

Both are measured the same way: every K interactions, greedy answers to the held-out prompts,
adoption = preference met AND a real answer (non-empty, not degenerate, on topic) AND not cut off
by the token limit. Every setting runs over several seeds (default 0, 1, 2) and the summary gives
the mean and spread; tune settings with `--eval-prompts validation`, never on the held-out curve.
Results go to
<out>/personalize.json (rewritten after every measurement, so a cut-short run still leaves its
curves) and <out>/personalize.png; a table is printed as it goes.

    .venv/bin/python bench/personalize.py                      # concise persona, combined method, seeds 0-2
    .venv/bin/python bench/personalize.py --eval-prompts validation --lr 1e-5   # tuning: validation prompts
    .venv/bin/python bench/personalize.py --persona concise --persona no_filler --method rl --method combined
    .venv/bin/python bench/personalize.py --skip-oracle --lora --lr 1e-4

Target (issue 6): >= 0.8 held-out adoption within 36 interactions for "concise", one other persona
improving by >= 0.3, the whole run in <= 30 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from _env import ROOT

from clawproxy.simulate.measure import Curve, LiveTable, plot_png, read_json, write_json


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--persona", action="append", choices=["concise", "bullets", "no_filler", "sign_off"],
                   help="Persona(s) to run (default: concise).")
    p.add_argument("--method", action="append", choices=["rl", "opd", "combined"],
                   help="Trainer method(s) for the full system (default: the config's, combined).")
    p.add_argument("--interactions", type=int, default=36)
    p.add_argument("--oracle-interactions", type=int, default=48)
    p.add_argument("--eval-every", type=int, default=12)
    p.add_argument("--turns", type=int, default=2, help="Questions per conversation.")
    p.add_argument("--max-tokens", type=int, default=512,
                   help="max_completion_tokens of conversation turns (OpenClaw sends its model's maxTokens). "
                        "Answers cut at the cap are 'truncated': never trained by default (trainer.truncated), "
                        "so it should be well above the base model's answer length.")
    p.add_argument("--sample-tokens", type=int, default=160, help="Oracle: sampled answer cap.")
    p.add_argument("--eval-max-tokens", type=int, default=160, help="Tokens per held-out answer.")
    p.add_argument("--temperature", type=float, default=0.7,
                   help="Sampling temperature of conversation turns (OpenClaw sends its configured one; "
                        "at 1.0 the default model rambles past any cap). The oracle samples at --oracle-temperature.")
    p.add_argument("--oracle-temperature", type=float, default=1.0)
    p.add_argument("--oracle-reward", choices=["binary", "graded"], default="binary",
                   help="Oracle reward: +1/-1 from the check, or graded by word count (concise).")
    p.add_argument("--oracle-baseline", action="store_true", help="Oracle: subtract the batch-mean reward.")
    p.add_argument("--seed", type=int, action="append",
                   help="Seed(s); each setting runs once per seed (default: 0, 1 and 2).")
    p.add_argument("--eval-prompts", choices=["heldout", "validation"], default="heldout",
                   help="Prompts the curves are measured on: 'validation' while tuning, 'heldout' for reported figures.")
    p.add_argument("--feedback", default=None, help="Feedback bank for the simulated user (default: the shipped one).")
    p.add_argument("--lora", action="store_true", help="LoRA instead of the config's fine-tuning mode.")
    p.add_argument("--lr", type=float, default=None, help="Trainer learning rate override.")
    p.add_argument("--batch-size", type=int, default=None, help="Trainer batch size override.")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="Extra config override for the system, e.g. trainer.w_opd=2 (YAML value).")
    p.add_argument("--system-oracle", action="store_true",
                   help="Full system with the judge replaced by the preference check (isolates the judge).")
    p.add_argument("--skip-oracle", action="store_true", help="Do not run the REINFORCE baseline.")
    p.add_argument("--oracle-only", action="store_true", help="Only the REINFORCE baseline.")
    p.add_argument("--oracle-json", default=None, help="Reuse oracle curves from an earlier results file.")
    p.add_argument("--config", default=None, help="Base config for the system (default configs/default.yaml).")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="Output directory.")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="Keep each run's checkpoints/ and models/ (deleted after the run by default; "
                        "the store, logs and curves are always kept).")
    p.add_argument("--threads", type=int, default=None, help="torch threads for the oracle (default: torch's).")
    return p.parse_args(argv)


class Results:
    """All curves of this run, rewritten to disk after every point."""

    def __init__(self, out: Path, args: argparse.Namespace) -> None:
        self.out = out
        self.curves: list[Curve] = []
        self.args = vars(args)
        self.t0 = time.monotonic()
        self.table = LiveTable()

    def add(self, curve: Curve) -> Curve:
        self.curves.append(curve)
        return curve

    def save(self) -> None:
        summary = summarize(self.curves)
        write_json(self.out / "personalize.json", self.curves,
                   {"args": self.args, "summary": summary, "wall_s": round(time.monotonic() - self.t0, 1)})
        if any(c.points for c in self.curves):
            plot_png(self.out / "personalize.png", [c for c in self.curves if c.points],
                     title="held-out adoption: " + ", ".join(sorted({c.persona for c in self.curves})))


def _group(label: str) -> str:
    return re.sub(r" seed \d+$", "", label)


def summarize(curves: list[Curve]) -> dict[str, Any]:
    """Per run: adoption, cut-off and degenerate shares at each point, the judge against the
    simulator, what became of the interactions. Per setting: mean and spread over its seeds."""
    runs = []
    for c in curves:
        if not c.points:
            continue
        runs.append({
            "label": c.label, "persona": c.persona, "method": c.method, "seed": c.settings.get("seed"),
            "wall_s": c.wall_s,
            "adoption": {p.interactions: p.adoption for p in c.points},
            "cut_off": {p.interactions: p.cut_off_share for p in c.points},
            "degenerate": {p.interactions: p.degenerate_share for p in c.points},
            "at_36": c.adoption_at(36),
            "judge_agreement": c.judge_agreement, "samples": c.samples,
        })
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(_group(r["label"]), []).append(r)
    settings = []
    for label, rs in groups.items():
        xs = sorted({x for r in rs for x in r["adoption"]})
        row: dict[str, Any] = {"setting": label, "seeds": [r["seed"] for r in rs], "adoption": {}, "cut_off": {}}
        for x in xs:
            vals = [r["adoption"][x] for r in rs if x in r["adoption"]]
            cuts = [r["cut_off"][x] for r in rs if x in r["cut_off"]]
            row["adoption"][x] = {"mean": round(statistics.fmean(vals), 3),
                                  "sd": round(statistics.pstdev(vals), 3), "min": min(vals), "max": max(vals), "n": len(vals)}
            row["cut_off"][x] = round(statistics.fmean(cuts), 3)
        settings.append(row)
    return {"runs": runs, "settings": settings}


def print_settings(summary: dict[str, Any]) -> None:
    for row in summary["settings"]:
        cells = ", ".join(f"{x}: {a['mean']:.2f} ± {a['sd']:.2f} (cut off {row['cut_off'][x]:.2f})"
                          for x, a in row["adoption"].items())
        print(f"{row['setting']} over seeds {row['seeds']}: {cells}")
    for r in summary["runs"]:
        if r["judge_agreement"]:
            a = r["judge_agreement"]
            print(f"{r['label']}: judge vs simulator right {a['right']}, zero {a['zero']}, wrong sign {a['wrong']}, "
                  f"unjudged {a['unjudged']}")
        if r["samples"]:
            print(f"{r['label']}: interactions -> samples: " + ", ".join(f"{k} {v}" for k, v in r["samples"].items()))


def run_oracle(persona: str, seed: int, args: argparse.Namespace, results: Results) -> None:
    from oracle import OracleSettings
    from oracle import run_oracle as oracle

    label = f"oracle ({persona}) seed {seed}"
    curve = results.add(Curve(label=label, persona=persona, method="oracle-reinforce"))

    def on_point(p: Any) -> None:
        curve.points.append(p)
        curve.wall_s = p.elapsed_s
        results.table.add(label, p)
        results.save()

    settings = OracleSettings(interactions=args.oracle_interactions, eval_every=args.eval_every,
                              max_new_tokens=args.sample_tokens, eval_max_tokens=args.eval_max_tokens,
                              temperature=args.oracle_temperature, seed=seed, threads=args.threads,
                              reward=args.oracle_reward, baseline=args.oracle_baseline,
                              eval_prompts=args.eval_prompts)
    done = oracle(persona, settings, on_point=on_point)
    curve.settings, curve.wall_s = done.settings, done.wall_s
    results.save()


def _yaml_value(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def run_system(persona: str, method: str | None, seed: int, args: argparse.Namespace, results: Results) -> None:
    from clawproxy.simulate.run import SimSettings, simulate
    from clawproxy.simulate.system import System

    overrides: dict[str, Any] = {
        "trainer.method": method,
        "trainer.finetune": "lora" if args.lora else None,
        "trainer.learning_rate": args.lr,
        "trainer.batch_size": args.batch_size,
        "judge.enabled": False if args.system_oracle else None,
    }
    for kv in args.set:
        key, _, value = kv.partition("=")
        overrides[key] = _yaml_value(value)
    tag = f"{method or 'default'}{'-lora' if args.lora else ''}{'-oracle' if args.system_oracle else ''}"
    data_dir = Path(args.out) / "runs" / f"{persona}-{tag}-s{seed}-{time.strftime('%H%M%S')}"
    system = System(data_dir, overrides, args.config)
    t0 = time.monotonic()
    system.start()
    cfg = system.config
    label = (f"{cfg.trainer.method}/{cfg.trainer.finetune}{' +oracle-judge' if args.system_oracle else ''} "
             f"({persona}) seed {seed}")
    curve = results.add(Curve(label=label, persona=persona, method=f"{cfg.trainer.method}/{cfg.trainer.finetune}"))
    print(f"[{label}] system up in {time.monotonic() - t0:.0f}s; data {data_dir}", flush=True)

    def on_point(p: Any) -> None:
        curve.points.append(p)
        curve.wall_s = round(time.monotonic() - t0, 1)
        results.table.add(label, p)
        results.save()

    settings = SimSettings(
        proxy_url=system.proxy_url, eval_url=system.engine_url, data_dir=str(data_dir), persona=persona,
        interactions=args.interactions, eval_every=args.eval_every, turns_per_conversation=args.turns,
        max_tokens=args.max_tokens, eval_max_tokens=args.eval_max_tokens, temperature=args.temperature,
        seed=seed, oracle=args.system_oracle, trainer_batch_size=cfg.trainer.batch_size,
        method=curve.method, label=label, feedback=args.feedback, eval_prompts=args.eval_prompts,
        extra={"overrides": {k: v for k, v in overrides.items() if v is not None}},
    )
    try:
        done = asyncio.run(simulate(settings, on_point=on_point))
        curve.settings, curve.judge_agreement, curve.samples = done.settings, done.judge_agreement, done.samples
    finally:
        system.stop()
        if not args.keep_checkpoints:  # ~0.5 GB a checkpoint: a few runs would fill a laptop's disk
            for sub in ("checkpoints", "models"):
                shutil.rmtree(data_dir / sub, ignore_errors=True)
    curve.wall_s = round(time.monotonic() - t0, 1)
    results.save()


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops like Ctrl-C: the started system is shut down in `finally`


def main(argv: list[str] | None = None) -> int:
    import signal

    signal.signal(signal.SIGTERM, _interrupt)
    args = parse_args(argv)
    personas = args.persona or ["concise"]
    methods = args.method or [None]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = Results(out, args)
    if args.oracle_json:
        results.curves.extend(c for c in read_json(args.oracle_json) if c.method == "oracle-reinforce")
    seeds = args.seed or [0, 1, 2]
    for persona in personas:
        for seed in seeds:
            if not args.skip_oracle and not args.oracle_json:
                run_oracle(persona, seed, args, results)
            if args.oracle_only:
                continue
            for method in methods:
                run_system(persona, method, seed, args, results)
    results.save()
    results.table.summary(results.curves)
    summary = summarize(results.curves)
    print(json.dumps(summary["settings"], indent=1))
    print_settings(summary)
    print(f"results: {out / 'personalize.json'}  plot: {out / 'personalize.png'}  "
          f"wall: {time.monotonic() - results.t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
