"""Learning by trying and the peer measures, per seed and over seeds, from `clawproxy simulate`'s curve.json files.

    .venv/bin/python bench/trying_report.py /tmp/i48/concise-s*/out/curve.json

For each run (each user of a several-user run): the student's held-out adoption at each point (no
instruction, greedy), the served adoption (what the user saw) overall and from the interaction the
preference was found, that interaction, the share of answers tried (overall and once found), the
judge on the tried answers (right / zero / wrong sign), the real-answer share of tried and untried
answers, samples trained, each step's kl_behaviour and clip fraction, and the wall time; the peer
measures (user effort per 12 interactions, the streak, capability at the start and the end, the told
baseline); each step's train, gate and canary seconds; then the mean and sample standard deviation
over the runs of one persona.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def rows(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    out = []
    for c in data["curves"]:
        t = c.get("trying") or {}
        steps = t.get("steps") or []
        kl = [s["kl_behaviour"] for s in steps if s.get("kl_behaviour") is not None]
        clip = [s["clip_frac"] for s in steps if s.get("clip_frac") is not None]
        out.append({
            "run": str(path.parent.parent.name or path), "user": c.get("user"), "persona": c["persona"],
            "seed": c["settings"].get("seed"),
            "adoption": {p["interactions"]: p["adoption"] for p in c["points"]},
            "served": t.get("served_adoption"), "served_after_found": t.get("served_adoption_after_found"),
            "found_at": t.get("found_at"), "tried_share": t.get("tried_share"),
            "tried_after_found": t.get("tried_share_after_found"), "judge_on_tried": t.get("judge_on_tried"),
            "real": t.get("real_answer_share"),
            "trained": sum(v for k, v in (c.get("samples") or {}).items() if k.startswith("trained")),
            "kl_behaviour": (min(kl), max(kl)) if kl else None, "clip_frac": (min(clip), max(clip)) if clip else None,
            "preferences": [(p["text"], p["status"], p["good"], p["bad"]) for p in t.get("preferences") or []
                            if p["status"] in ("active", "demoted")],
            "wall_min": round(c.get("wall_s", 0.0) / 60, 1),
            "effort": (c.get("peers") or {}).get("effort"), "streak_at": (c.get("peers") or {}).get("streak_at"),
            "told": (c.get("peers") or {}).get("told"),
            "capability": ((c.get("peers") or {}).get("capability") or {}),
            "degenerate_end": c["points"][-1]["degenerate_share"] if c["points"] else None,
            "short_is_broken": c["settings"].get("short_is_broken"),
        })
    return out


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.2f}"
    if isinstance(x, tuple):
        return "-".join(f"{v:.3f}" for v in x)
    return str(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("curves", nargs="+", type=Path, help="curve.json files of `clawproxy simulate --out`")
    args = ap.parse_args()
    all_rows = [r for p in args.curves for r in rows(p)]
    for r in all_rows:
        adoption = " / ".join(f"{_fmt(v)}" for _, v in sorted(r["adoption"].items(), key=lambda kv: int(kv[0])))
        j = r["judge_on_tried"] or {}
        real = r["real"] or {}
        print(f"{r['run']} {r['user'] or ''} {r['persona']} seed {r['seed']}: adoption {adoption}; served "
              f"{_fmt(r['served'])}, after found {_fmt(r['served_after_found'])}; found at {_fmt(r['found_at'])}; "
              f"tried {_fmt(r['tried_share'])}, after found {_fmt(r['tried_after_found'])}; judge on tried "
              f"{j.get('right', 0)}/{j.get('zero', 0)}/{j.get('wrong', 0)}; real answers tried/untried "
              f"{_fmt(real.get('tried'))}/{_fmt(real.get('untried'))}; trained {r['trained']}; kl_behaviour "
              f"{_fmt(r['kl_behaviour'])}, clip {_fmt(r['clip_frac'])}; {r['wall_min']} min; found: {r['preferences']}")
        cap = r["capability"]
        print(f"    effort {r['effort']}; streak from {_fmt(r['streak_at'])}; told {_fmt(r['told'])}; capability "
              f"{cap.get('base', '-')} -> {cap.get('final', '-')} of {cap.get('tasks', '-')}; degenerate at the end "
              f"{_fmt(r['degenerate_end'])}; the user calls a word or two broken: {r['short_is_broken']}")
    by_persona: dict[str, list[dict[str, Any]]] = {}
    for r in all_rows:
        by_persona.setdefault(r["persona"], []).append(r)
    for persona, rs in by_persona.items():
        points = sorted({int(k) for r in rs for k in r["adoption"]})
        parts = []
        for k in points:
            vals = [r["adoption"].get(str(k), r["adoption"].get(k)) for r in rs]
            vals = [v for v in vals if v is not None]
            if vals:
                sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
                parts.append(f"{k}: {statistics.mean(vals):.2f} (sd {sd:.2f}, n {len(vals)})")
        found = [r["found_at"] for r in rs]
        ratios = [r["effort"][-1] / r["effort"][0] for r in rs if r["effort"] and len(r["effort"]) > 1 and r["effort"][0]]
        streaks = [r["streak_at"] for r in rs]
        print(f"{persona} over {len(rs)} run(s): adoption {'; '.join(parts)}; found by 12 in "
              f"{sum(f is not None and f <= 12 for f in found)} of {len(rs)}; effort last/first "
              f"{_mean_sd(ratios)}; streak by 24 in {sum(s is not None and s <= 24 for s in streaks)} of {len(rs)}")


def _mean_sd(vals: list[float]) -> str:
    if not vals:
        return "-"
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.mean(vals):.2f} (sd {sd:.2f}, n {len(vals)})"


if __name__ == "__main__":
    main()
