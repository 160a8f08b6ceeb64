"""Personalization benchmark: does talking to clawproxy teach the model a user's preference?

1. Oracle baseline (no judge, no proxy): bare REINFORCE on the default model with the preference
   check as the reward: full fine-tuning, AdamW lr 1e-5, batch 4, sampled answers of <= 160 tokens.
2. The full system: `clawproxy start` (proxy -> judge -> trainer -> hot reload) driven by the
   simulated persona through the proxy, for each --method.

Both are measured the same way: every K interactions, greedy answers to the held-out prompts,
adoption = preference met AND a real answer (non-empty, not degenerate, on topic). Results go to
<out>/personalize.json (rewritten after every measurement, so a cut-short run still leaves its
curves) and <out>/personalize.png; a table is printed as it goes.

    .venv/bin/python bench/personalize.py                      # concise persona, combined method
    .venv/bin/python bench/personalize.py --persona concise --persona no_filler --method rl --method combined
    .venv/bin/python bench/personalize.py --skip-oracle --lora --lr 1e-4

Target (issue 6): >= 0.8 held-out adoption within 36 interactions for "concise", one other persona
improving by >= 0.3, the whole run in <= 30 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
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
    p.add_argument("--seed", type=int, default=0)
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


def summarize(curves: list[Curve]) -> list[dict[str, Any]]:
    rows = []
    for c in curves:
        if not c.points:
            continue
        base = c.points[0].adoption
        best = max(p.adoption for p in c.points)
        rows.append({
            "label": c.label, "persona": c.persona, "method": c.method, "wall_s": c.wall_s,
            "adoption": {p.interactions: p.adoption for p in c.points},
            "degenerate": {p.interactions: p.degenerate_share for p in c.points},
            "improvement": round(best - base, 3),
            "at_36": c.adoption_at(36),
        })
    return rows


def run_oracle(persona: str, args: argparse.Namespace, results: Results) -> None:
    from oracle import OracleSettings
    from oracle import run_oracle as oracle

    label = f"oracle ({persona})"
    curve = results.add(Curve(label=label, persona=persona, method="oracle-reinforce"))

    def on_point(p: Any) -> None:
        curve.points.append(p)
        curve.wall_s = p.elapsed_s
        results.table.add(label, p)
        results.save()

    settings = OracleSettings(interactions=args.oracle_interactions, eval_every=args.eval_every,
                              max_new_tokens=args.sample_tokens, eval_max_tokens=args.eval_max_tokens,
                              temperature=args.oracle_temperature, seed=args.seed, threads=args.threads,
                              reward=args.oracle_reward, baseline=args.oracle_baseline)
    done = oracle(persona, settings, on_point=on_point)
    curve.settings, curve.wall_s = done.settings, done.wall_s
    results.save()


def _yaml_value(text: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def run_system(persona: str, method: str | None, args: argparse.Namespace, results: Results) -> None:
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
    data_dir = Path(args.out) / "runs" / f"{persona}-{tag}-{time.strftime('%H%M%S')}"
    system = System(data_dir, overrides, args.config)
    t0 = time.monotonic()
    system.start()
    cfg = system.config
    label = f"{cfg.trainer.method}/{cfg.trainer.finetune}{' +oracle-judge' if args.system_oracle else ''} ({persona})"
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
        seed=args.seed, oracle=args.system_oracle, trainer_batch_size=cfg.trainer.batch_size,
        method=curve.method, label=label,
        extra={"overrides": {k: v for k, v in overrides.items() if v is not None}},
    )
    try:
        done = asyncio.run(simulate(settings, on_point=on_point))
        curve.settings = done.settings
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
    for persona in personas:
        if not args.skip_oracle and not args.oracle_json:
            run_oracle(persona, args, results)
        if args.oracle_only:
            continue
        for method in methods:
            run_system(persona, method, args, results)
    results.save()
    results.table.summary(results.curves)
    print(json.dumps(summarize(results.curves), indent=1))
    print(f"results: {out / 'personalize.json'}  plot: {out / 'personalize.png'}  "
          f"wall: {time.monotonic() - results.t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
