"""Which instruction does the judge's chooser pick from a simulated user's replies?

``judge.hints: choose`` turns a user's replies into one instruction of the generic bank
(``judge/data/instructions.txt``, written without the simulator's preferences in view). This runs
each persona's replies to the base model's answers on the train prompts (recorded answers, from a
``bench/hinted.py --out`` file: no model runs here) through the chooser, with 1, 3 and 5 replies, and
counts what it picks. Without ``--engine-url`` the choice is the embedding shortlist's nearest; with
it, the engine's model re-ranks the shortlist (PMI), as the judge does.

    .venv/bin/python bench/chooser.py --answers bench/results/i24/hinted-framings.json \\
        --persona concise --persona bullets --persona sign_off

A persona whose instruction the bank lacks (``sign_off``: a fixed closing line) shows what happens
then: the nearest instruction, or none (the quote stands).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from _env import ROOT  # noqa: F401  (sets up the environment)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--answers", required=True, help="A bench/hinted.py --out file: its untold answers are used.")
    p.add_argument("--persona", action="append", default=None, help="Persona (repeatable; default: all).")
    p.add_argument("--reactions", type=int, action="append", default=None,
                   help="Replies the chooser reads (repeatable; default 1, 3 and 5).")
    p.add_argument("--engine-url", default=None, help="Re-rank the shortlist with this engine's model.")
    p.add_argument("--model", default=None, help="The engine's model name (default: its first).")
    p.add_argument("--chooser", default="pmi", choices=("pmi", "channel"),
                   help="How the engine's model ranks the shortlist (judge.hints.InstructionChooser).")
    p.add_argument("--out", default=None, help="Write the picks as JSON here.")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    from clawproxy.simulate.personas import PREFERENCES, ScriptedPersona
    from judge.hints import InstructionChooser, corrective_part

    args = parse_args(argv)
    rows = json.loads(Path(args.answers).read_text())
    answers: dict[str, str] = next(r["answers"] for r in rows if r["condition"] == "untold")
    prompts = list(answers)
    logprobs = None
    if args.engine_url:
        from judge.voters import LLMVoter

        logprobs = LLMVoter(args.engine_url, args.model, temperature=0.0).continuation_logprobs
    chooser = InstructionChooser(logprobs, method=args.chooser)
    out = []
    for name in args.persona or list(PREFERENCES):
        pref = PREFERENCES[name]
        persona = ScriptedPersona(pref, seed=0)
        said = []
        for i, p in enumerate(prompts):
            a = answers[p]
            if persona.check(a):
                continue  # a met answer draws praise, not a complaint
            msg = persona.react(p, a, prompts[(i + 1) % len(prompts)]).message
            said.append(corrective_part(msg, p))
        for k in args.reactions or [1, 3, 5]:
            picks = [chooser.choose([said[(i - j) % len(said)] for j in range(k)]) for i in range(len(said))]
            counts = Counter(x or "(none: the quote stands)" for x in picks)
            out.append({"persona": name, "told": pref.hint, "reactions": k, "complaints": len(said),
                        "picks": dict(counts.most_common())})
            top = ", ".join(f"{n}x {x}" for x, n in counts.most_common(3))
            print(f"{name:<9} k={k}  ({len(said)} complaints)  {top}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
