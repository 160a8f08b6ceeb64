"""Can the model do what the user asks when it is told? Greedy answers with and without the hint.

The OPD teacher is the policy itself with the user's correction in context (``[User's hint: ...]``,
as the trainer writes it). What the told model does not do, distillation from it cannot teach, and
binary RL is left to find it by sampling. This answers train prompts greedily three ways for each
persona: as asked, with the persona's plain instruction as the hint (``Answer directly, with no
apologies, ...``), and with the persona's own complaints as the hint (what the judge passes on),
and grades each answer with the persona's check and the benchmark's real-answer checks. Two more
conditions pass the hint the judge would write for the persona's whole message (its complaint, the
transition and the next question): ``quoted`` (the CPU voters' quote, ``judge/hints.py``) and, with
``--engine-url``, ``written`` (``judge.hints: llm``: the engine's model rewrites the message as one
instruction). ``quote_bare`` and ``quote_framed`` pass the same quote in other framings, to choose
the judge's.

The memory conditions give the teacher more than one reply, as ``judge.hints`` can from the user's
memory: the persona's reaction to this answer and to the answers before it (``--reactions`` of
them): ``memory`` quotes them together, ``examples`` shows two reacted-to answers with their
replies, ``chosen`` is the instruction of the generic bank (``judge/data/instructions.txt``) the
reactions point to (nearest by embedding, then, with ``--engine-url``, likeliest given them; the
quote when none fits) and ``chosen_quote`` that instruction followed by the quote.

    .venv/bin/python bench/hinted.py                        # every persona, 8 train prompts
    .venv/bin/python bench/hinted.py --persona bullets --prompts 16

    .venv/bin/python bench/hinted.py --engine-url http://127.0.0.1:8000 --model qwen2.5-coder-1.5b

Figures: bench/results/README.md (the 1.5B through vLLM, and SmolLM2-135M in process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from _env import ROOT  # noqa: F401  (sets up the environment)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--persona", action="append", default=None, help="Persona (repeatable; default: all).")
    p.add_argument("--prompts", type=int, default=8, help="Train prompts answered per condition.")
    p.add_argument("--max-tokens", type=int, default=160, help="Greedy tokens per answer (the benchmark's).")
    p.add_argument("--model", default="default", help="Model spec, as engine.model.")
    p.add_argument("--data-dir", default=None, help="Where the converted default model is cached.")
    p.add_argument("--engine-url", default=None,
                   help="Answer through this OpenAI-compatible engine (e.g. the vLLM serving --model) "
                        "instead of in-process transformers; greedy either way.")
    p.add_argument("--reactions", type=int, default=3,
                   help="Replies the memory conditions see: this answer's and the ones before it.")
    p.add_argument("--no-llm-choice", action="store_true",
                   help="Choose the instruction by the embedding shortlist alone, even with --engine-url.")
    p.add_argument("--chooser", default="pmi", choices=("pmi", "channel"),
                   help="How the engine's model ranks the shortlist (judge.hints.InstructionChooser).")
    p.add_argument("--only", action="append", default=None,
                   help="Run only these conditions (repeatable; untold always runs).")
    p.add_argument("--out", default=None, help="Write the results (answers included) as JSON here.")
    return p.parse_args(argv)


# framings of the judge's quote, beside the one it uses ("quoted"); generic, none from the persona banks
FRAMINGS = {
    "quote_bare": "{said}",
    "quote_framed": "The user replied: '{said}'. Follow that.",
}


def hinted_prompt(prompt: str, hint: str) -> str:
    """The user message the OPD teacher sees: the trainer's own ``add_hint``."""
    from trainer.batch import add_hint

    return add_hint([{"role": "user", "content": prompt}], hint)[0]["content"]


async def _answer_via(url: str, texts: list[str], model: str | None, max_tokens: int) -> list:
    """Greedy answers from an OpenAI-compatible engine, the user message alone (as ``generate``)."""
    import aiohttp

    from clawproxy.httpjson import strip_v1
    from clawproxy.simulate.driver import stream_chat

    async with aiohttp.ClientSession() as http:
        if model is None:
            async with http.get(strip_v1(url) + "/v1/models") as r:
                model = (await r.json())["data"][0]["id"]

        async def one(text: str):
            body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": True,
                    "max_completion_tokens": max_tokens, "temperature": 0.0}
            return await stream_chat(http, strip_v1(url) + "/v1/chat/completions", body, {}, 900.0)

        return await asyncio.gather(*(one(t) for t in texts))


def main(argv: list[str] | None = None) -> list[dict]:
    from _generate import generate

    from clawproxy.engine.model import load_model_and_tokenizer
    from clawproxy.simulate.measure import score_answers
    from clawproxy.simulate.personas import (
        PREFERENCES,
        ScriptedPersona,
        complaint_fields,
        load_feedback,
    )
    from clawproxy.simulate.prompts import TRAIN_PROMPTS
    from judge.extract import JudgeInput
    from judge.hints import (
        InstructionChooser,
        corrective_part,
        examples_hint,
        feedback_hint,
        memory_hint,
    )

    args = parse_args(argv)
    personas = args.persona or list(PREFERENCES)
    unknown = [p for p in personas if p not in PREFERENCES]
    if unknown:
        raise SystemExit(f"unknown persona {unknown[0]!r}; use one of {', '.join(PREFERENCES)}")
    prompts = list(TRAIN_PROMPTS[: args.prompts])
    cut: dict[str, bool] = {}  # answer text -> the token limit cut it off

    wanted = set(args.only or [])

    def runs(cond: str) -> bool:
        return not wanted or cond in wanted

    writer = None
    chooser = InstructionChooser()  # the embedding shortlist alone, unless an engine scores it
    if args.engine_url:
        from judge.voters import HintWriter, LLMVoter

        model_name = args.model if args.model != "default" else None
        llm = LLMVoter(args.engine_url, model_name, temperature=0.0, max_tokens=60)
        writer = HintWriter(llm)
        if not args.no_llm_choice:
            chooser = InstructionChooser(llm.continuation_logprobs, method=args.chooser)

        def answer(texts: list[str]) -> list[str]:
            comps = asyncio.run(_answer_via(args.engine_url, texts, model_name, args.max_tokens))
            for c in comps:
                cut[c.text] = c.finish_reason == "length"
            return [c.text for c in comps]
    else:
        model, tok = load_model_and_tokenizer(args.model, args.data_dir)  # in eval mode

        def answer(texts: list[str]) -> list[str]:  # one at a time: no answer depends on padding
            outs = [generate(model, tok, [t], args.max_tokens, sample=False)[0] for t in texts]
            for _, ids, text in outs:
                cut[text] = len(ids) >= args.max_tokens and ids[-1] != tok.eos_token_id
            return [text for _, _, text in outs]

    hint_log: dict[tuple[str, str], list[str | None]] = {}
    plain = answer(prompts)
    results = []
    print(f"{'persona':<10} {'condition':<11} {'met':>5} {'adopted':>8} {'degen.':>7} {'words':>6}")
    for name in personas:
        pref = PREFERENCES[name]
        fields = [complaint_fields(a) for a in plain]
        complaints = load_feedback().for_persona(name).complaints
        conditions = {"untold": plain}
        if runs("told"):
            conditions["told"] = answer([hinted_prompt(p, pref.hint) for p in prompts])
        if runs("complained"):
            conditions["complained"] = answer([
                hinted_prompt(p, complaints[i % len(complaints)].format(**fields[i]))
                for i, p in enumerate(prompts)
            ])
        # what the judge sees after a missed answer: the persona's message, next question included
        persona = ScriptedPersona(pref, seed=0)
        seen = [JudgeInput(request=p, response=a, role="user",
                           next_state=persona.react(p, a, prompts[(i + 1) % len(prompts)]).message)
                for i, (p, a) in enumerate(zip(prompts, plain, strict=True))]
        quoted = [feedback_hint(x) for x in seen]
        judge_hints: dict[str, list[str | None]] = {"quoted": quoted}
        # the same quote in other framings, to choose the judge's on train prompts
        for cond, frame in FRAMINGS.items():
            judge_hints[cond] = [frame.format(said=corrective_part(x.next_state, x.request)) if q else None
                                 for x, q in zip(seen, quoted, strict=True)]
        if writer is not None and runs("written"):
            judge_hints["written"] = [writer.write(x) or feedback_hint(x) for x in seen]
        # the memory: this answer's reply and the replies to the answers before it, newest first
        said = [corrective_part(x.next_state, x.request) for x in seen]
        k = args.reactions
        before = [[(i - j) % len(prompts) for j in range(k)] for i in range(len(prompts))]
        judge_hints["memory"] = [memory_hint([said[j] for j in js]) for js in before]
        judge_hints["examples"] = [examples_hint([(plain[j], said[j]) for j in js[:2]]) for js in before]
        if runs("chosen") or runs("chosen_quote"):
            chosen = [chooser.choose([said[j] for j in js]) for js in before]
            judge_hints["chosen"] = [c or q for c, q in zip(chosen, quoted, strict=True)]
            judge_hints["chosen_quote"] = [f"{c} {q}" if c and q else c or q
                                           for c, q in zip(chosen, quoted, strict=True)]
        judge_hints = {c: h for c, h in judge_hints.items() if runs(c)}
        for cond, hints in judge_hints.items():
            conditions[cond] = answer([hinted_prompt(p, h) if h else p for p, h in zip(prompts, hints, strict=True)])
            hint_log[(name, cond)] = hints
        for cond, answers in conditions.items():
            graded = score_answers(prompts, answers, pref.check, cut_off=[cut.get(a, False) for a in answers])
            n = len(graded)
            row = {
                "persona": name, "condition": cond, "n": n,
                "preference_rate": sum(g.met for g in graded) / n,
                "adoption": sum(g.adopted for g in graded) / n,
                "degenerate_share": sum(g.degenerate is not None for g in graded) / n,
                "cut_off_share": sum(g.cut_off for g in graded) / n,
                "mean_words": sum(g.words for g in graded) / n,
                "answers": dict(zip(prompts, answers, strict=True)),
            }
            if (name, cond) in hint_log:
                row["hints"] = hint_log[(name, cond)]
            results.append(row)
            print(f"{name:<10} {cond:<11} {row['preference_rate']:>5.2f} {row['adoption']:>8.2f} "
                  f"{row['degenerate_share']:>7.2f} {row['mean_words']:>6.0f}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
