"""`clawproxy judge run|eval`.

Only light imports at module level: `clawproxy` imports this on every command, and the proxy path
must not pull in torch or the sentence encoder.
"""

from __future__ import annotations

import logging

import click

from clawproxy.cli_options import (
    CONTEXT_SETTINGS,
    build_config,
    config_options,
    make_console,
    progress,
)
from judge.config import VOTERS


@click.group(context_settings=CONTEXT_SETTINGS)
def judge() -> None:
    """Score recorded turns from what happened next."""


@judge.command(context_settings=CONTEXT_SETTINGS)
@config_options
@click.option("--follow", is_flag=True, help="Keep polling for new turns until SIGTERM/Ctrl-C.")
@click.option("-n", "--limit", type=int, default=None, help="Stop after judging this many turns.")
@click.option("--voter", type=click.Choice(VOTERS), default=None, help="Override judge.voter.")
@click.option("--votes", type=int, default=None, help="Override judge.votes (m).")
@click.option("--no-progress", is_flag=True, help="No progress bar (logs only).")
def run(config_path, data_dir, follow, limit, voter, votes, no_progress) -> None:
    """Judge every trainable main turn that has a next state and no judgment yet."""
    from clawproxy.stop import on_signals
    from clawproxy.store import Store
    from judge.trying import Trier
    from judge.voters import build_hint_writer, build_voter, min_confidence
    from judge.worker import Worker

    cfg = build_config(config_path, data_dir, **{"judge.voter": voter, "judge.votes": votes})
    logging.basicConfig(level=logging.INFO, format="%(asctime)s judge %(levelname)s %(message)s")
    store = None
    with on_signals() as stop:  # SIGTERM/Ctrl-C end the loop; the handler takes no lock
        try:
            store = Store(cfg.db_path)
            the_voter = build_voter(cfg)
            worker = Worker(store, the_voter, votes=cfg.judge.votes, batch_size=cfg.judge.batch_size,
                            hint_writer=build_hint_writer(cfg), min_confidence=min_confidence(cfg, the_voter),
                            memory_size=cfg.judge.memory_reactions, trier=Trier(store, cfg.trying))
            total = None if follow else store.judge_backlog()["pending"]
            if limit is not None and total is not None:
                total = min(total, limit)
            with progress(f"judging ({worker.voter.name}, m={worker.votes})", total, no_progress) as advance:
                n = worker.run(follow, cfg.judge.poll_interval_s, stop, limit=limit, progress=advance)
        finally:
            if store is not None:
                store.close()
    click.echo(f"judged {n} turn(s) into {cfg.db_path}")


@judge.command("eval", context_settings=CONTEXT_SETTINGS)
@config_options
@click.option("--voter", "voters", type=click.Choice(VOTERS), multiple=True,
              help="Voter(s) to score (repeatable; default: embedding and lexical, plus llm when "
                   "--llm-url or --local-model is given).")
@click.option("--split", type=click.Choice(["heldout", "heldout2", "validation", "registers", "train", "all"]), default="heldout",
              show_default=True, help="Which labeled cases (held-out is never tuned on).")
@click.option("--votes", type=int, default=None, help="Votes per case (default judge.votes).")
@click.option("--llm-url", default=None, help="OpenAI-compatible base URL for the llm voter.")
@click.option("--llm-model", default=None, help="Model name for the llm voter.")
@click.option("--local-model", default=None,
              help="Run the llm voter in-process with transformers on this model ('default' = the 135M).")
@click.option("-n", "--limit", type=int, default=None, help="Only the first N cases (quick looks).")
@click.option("--stride", type=int, default=1, show_default=True,
              help="Every K-th case only: a spread-out subset for slow voters (e.g. a CPU LLM).")
@click.option("--errors", "show_errors", is_flag=True, help="List the misjudged case ids.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--tradeoff", is_flag=True,
              help="Also replay other confidence thresholds: sign precision against coverage.")
@click.option("--uss", "uss_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Score real people's rated replies instead: a snapshot of the User Satisfaction Simulation "
                   "corpus (github.com/sunnweiwei/user-satisfaction-simulation, its dataset/ folder or the one "
                   "above); prints the trade-off table per source.")
@click.option("--uss-split", type=click.Choice(["validation", "test", "train", "all"]), default="validation",
              show_default=True, help="Which MWOZ and SGD dialogues --uss scores (other sources: all).")
def eval_cmd(config_path, voters, split, votes, llm_url, llm_model, local_model, data_dir, limit,
             stride, show_errors, as_json, tradeoff, uss_dir, uss_split) -> None:
    """Accuracy, per-class precision/recall, FPR and FNR of each voter on the labeled cases
    (with --uss: sign precision, wrong signs and coverage on real people's replies)."""
    import orjson

    from judge.eval.dataset import load_cases
    from judge.eval.evaluate import TRADEOFF_GRID, evaluate, render, render_tradeoff
    from judge.voters import Voter, build_voter, min_confidence

    cfg = build_config(config_path, data_dir, **{"judge.votes": votes, "judge.llm_url": llm_url,
                                                     "judge.llm_model": llm_model})
    if not voters:
        voters = ("embedding", "lexical") + (("llm",) if (llm_url or local_model) else ())
    if stride < 1:
        raise click.BadParameter("must be >= 1", param_hint="--stride")
    console = make_console()
    if uss_dir is not None:
        _eval_uss(cfg, voters, uss_dir, uss_split, stride, limit, as_json, console)
        return
    cases = load_cases(split)[::stride]
    if limit:
        cases = cases[:limit]
    reports = []
    for name in voters:
        if name == "llm" and local_model:
            from judge.eval.local_llm import LocalLLMVoter

            voter: Voter = LocalLLMVoter(local_model, cfg.data_path, cfg.judge.temperature,
                                  max_tokens=cfg.judge.llm_max_tokens)
        else:
            voter = build_voter(cfg, name)
        with progress(f"eval {name}", len(cases), disable=as_json) as advance:
            report = evaluate(voter, cases, cfg.judge.votes, split, progress=advance,
                              min_confidence=min_confidence(cfg, voter))
        reports.append(report)
        if not as_json:
            render(report, console, show_errors=show_errors)
            if tradeoff:
                render_tradeoff(report, console)
    if as_json:
        out = [{**r.as_dict(), **({"tradeoff": r.tradeoff(list(TRADEOFF_GRID))} if tradeoff else {})}
               for r in reports]
        click.echo(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


def _eval_uss(cfg, voters, uss_dir, uss_split, stride, limit, as_json, console) -> None:
    """``judge eval --uss``: every voter on the replies rated good or bad, per source."""
    from pathlib import Path

    import orjson

    from judge.eval.evaluate import evaluate
    from judge.eval.uss import SOURCES, load_uss, render_uss, uss_rows
    from judge.voters import build_voter, min_confidence

    found = load_uss(Path(uss_dir), list(SOURCES), uss_split)
    if not found:
        raise click.ClickException(f"{uss_dir} has none of {', '.join(SOURCES.values())} (nor a dataset/ "
                                   "folder with them); point --uss at the corpus's dataset/ folder")
    rows = []
    for name in voters:
        if name == "llm" and cfg.judge.llm_url is None:
            raise click.ClickException("--uss scores the llm voter through --llm-url only")
        voter = build_voter(cfg, name)
        reports = {}
        for source, cases in found.items():
            cases = [c for c in cases if c.label != "neutral"][::stride][:limit]
            with progress(f"eval {name} on {source}", len(cases), disable=as_json) as advance:
                reports[source] = evaluate(voter, cases, cfg.judge.votes, f"uss-{uss_split}", progress=advance,
                                           min_confidence=min_confidence(cfg, voter))
        rows += uss_rows(reports)
    if as_json:
        click.echo(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
    else:
        render_uss(rows, uss_split, console)
