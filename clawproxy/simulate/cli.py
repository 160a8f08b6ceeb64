"""`clawproxy simulate`: a scripted user teaches the running system a preference; measure adoption."""

from __future__ import annotations

import time
from pathlib import Path

import click

PERSONAS = ("concise", "bullets", "no_filler", "sign_off")  # the shipped persona files


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--persona", type=click.Choice(PERSONAS), default="concise", show_default=True,
              help="The simulated user's preference: one of the shipped persona files.")
@click.option("--persona-file", default=None, type=click.Path(dir_okay=False),
              help="Your own persona (YAML: what the user wants, its check, their words; docs/personas.md). "
                   "Replaces --persona.")
@click.option("--short-answers", type=click.Choice(["broken", "fine"]), default="broken", show_default=True,
              help="What the simulated user calls an answer of a word or two that cannot answer the question: "
                   "'fine' is the user of the runs before 2026-12, kept to compare with them.")
@click.option("--no-peers", is_flag=True,
              help="Skip capability (base and last point) and the told baseline, measured beside adoption.")
@click.option("--interactions", type=int, default=36, show_default=True,
              help="Assistant turns that get the persona's feedback.")
@click.option("--eval-every", type=int, default=12, show_default=True,
              help="Measure held-out adoption every K interactions.")
@click.option("--turns", "turns_per_conversation", type=int, default=3, show_default=True,
              help="Questions per conversation (each re-sends the whole history).")
@click.option("--max-tokens", type=int, default=512, show_default=True,
              help="max_completion_tokens per turn (OpenClaw sends its model's maxTokens).")
@click.option("--eval-max-tokens", type=int, default=160, show_default=True, help="Tokens per held-out answer.")
@click.option("--temperature", type=float, default=0.7, show_default=True,
              help="Sampling temperature of the conversation turns (at 1.0 the default model rambles past any cap).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--proxy-url", default=None,
              help="A running `clawproxy start` (e.g. http://127.0.0.1:8080). Without it, a fresh system is started.")
@click.option("--engine-url", default=None,
              help="The engine serving the weights, for measurement (default: the started system's engine; "
                   "with --proxy-url and no --engine-url, measurement goes through the proxy, a session per answer, so none is ever judged).")
@click.option("--data-dir", default=None,
              help="Data dir of the system (its store gives judge scores). Default for a started system: "
                   "./clawproxy-simulate-<time>.")
@click.option("--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="Config file for the started system (default configs/default.yaml).")
@click.option("--method", type=click.Choice(["rl", "opd", "combined"]), default=None,
              help="Trainer method of the started system (default: the config's).")
@click.option("--lora/--full", "lora", default=None, help="LoRA adapter or full fine-tuning (default: the config's).")
@click.option("--lr", type=float, default=None, help="Trainer learning rate override.")
@click.option("--batch-size", type=int, default=None, help="Trainer batch size override.")
@click.option("--oracle", is_flag=True,
              help="Reward from the preference itself: the judge is off and the simulator writes each turn's judgment.")
@click.option("--llm-persona-url", default=None,
              help="OpenAI-compatible endpoint that writes the persona's feedback (GPU users); the check stays scripted.")
@click.option("--llm-persona-model", default="default", show_default=True)
@click.option("--feedback", "feedback_path", default=None, type=click.Path(dir_okay=False),
              help="Feedback bank (YAML: praise, complaints, broken-answer complaints, transitions per persona). "
                   "Default: each persona file's own words (docs/personas.md).")
@click.option("--eval-prompts", type=click.Choice(["heldout", "validation"]), default="heldout", show_default=True,
              help="Prompts the curve is measured on: 'validation' while tuning settings, 'heldout' for the reported curve.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Where curve.json and curve.png go (default: <data-dir>/simulate).")
@click.option("--no-settle", is_flag=True, help="Measure without waiting for the judge/trainer to catch up.")
@click.option("--users", "users_spec", default=None, metavar="PERSONA,PERSONA,...",
              help="Several users on one server, one per persona (e.g. concise,concise,bullets): each talks "
                   "with their own API key, trains their own adapter and gets a curve, with cross-talk.")
@click.option("--share", is_flag=True, help="With --users: the users share (their turns also train the shared adapter).")
@click.pass_context
def simulate(ctx, persona, persona_file, short_answers, no_peers, interactions, eval_every, turns_per_conversation, max_tokens, eval_max_tokens,
             temperature, seed, proxy_url, engine_url, data_dir, config_path, method, lora, lr,
             batch_size, oracle, llm_persona_url, llm_persona_model, feedback_path, eval_prompts, out_dir,
             no_settle, users_spec, share) -> None:
    """Drive a running (or freshly started) clawproxy with a simulated user; plot held-out adoption."""
    import asyncio

    from clawproxy.errors import ClawproxyError
    from clawproxy.simulate.measure import LiveTable, plot_png, write_json
    from clawproxy.simulate.personas import make_persona
    from clawproxy.simulate.run import SimSettings
    from clawproxy.simulate.run import simulate as run_sim
    from clawproxy.simulate.system import System
    from clawproxy.stop import terminate_unwinds

    if persona_file is not None:
        if ctx.get_parameter_source("persona") is not click.core.ParameterSource.DEFAULT:
            raise click.UsageError("--persona and --persona-file name one user each; give one of them.")
        persona = persona_file
    personas = [persona]
    if users_spec is None:
        if share:
            raise click.UsageError("--share goes with --users (several simulated users).")
    else:
        from clawproxy.simulate.multi import parse_users

        if ctx.get_parameter_source("persona") is not click.core.ParameterSource.DEFAULT:
            raise click.UsageError("--persona is one user; with --users, name each user's persona there.")
        if proxy_url is not None and data_dir is None:
            raise click.UsageError("--users with --proxy-url needs that system's --data-dir, to add the users to its store.")
        try:
            personas = parse_users(users_spec)
        except ClawproxyError as e:
            raise click.UsageError(e.message) from e
    try:
        for p in dict.fromkeys(personas):  # a bad file fails before a system starts
            make_persona(p, feedback=feedback_path)
    except ClawproxyError as e:
        raise click.ClickException(e.message) from e
    overrides = {
        "trainer.method": method,
        "trainer.finetune": None if lora is None else ("lora" if lora else "full"),
        "trainer.learning_rate": lr,
        "trainer.batch_size": batch_size,
        "judge.enabled": False if oracle else None,
    }
    system = None
    users = None
    if proxy_url is None:
        data_dir = data_dir or f"./clawproxy-simulate-{time.strftime('%Y%m%d-%H%M%S')}"
        system = System(data_dir, overrides, config_path)
        if users_spec is not None:
            try:
                system.write_config()
                users = _add_users(data_dir, personas, share, system.config)
                system.api_key = users[0].key  # the readiness probe's /v1/models needs a known key
            except BaseException:
                system.stop()  # lets go of the ports it holds
                raise
        click.echo(f"starting clawproxy (data: {system.data_dir}, log: {system.log_path}) ...")
        try:
            system.start()
        except ClawproxyError as e:
            raise click.ClickException(e.message) from e
        proxy_url, engine_url = system.proxy_url, engine_url or system.engine_url
        cfg = system.config
    else:
        if any(v is not None for v in overrides.values()) and not oracle:
            click.echo("note: --method/--lora/--lr/--batch-size only configure a system this command starts.")
        from clawproxy.config import load_config

        cfg = load_config(config_path, {"data_dir": data_dir})
        if users_spec is not None:
            users = _add_users(data_dir, personas, share)
    settings = SimSettings(
        proxy_url=proxy_url, eval_url=engine_url, data_dir=data_dir, persona=persona,
        interactions=interactions, eval_every=eval_every, turns_per_conversation=turns_per_conversation,
        max_tokens=max_tokens, eval_max_tokens=eval_max_tokens, temperature=temperature, seed=seed,
        oracle=oracle, settle=not no_settle, trainer_batch_size=cfg.trainer.batch_size,
        method=f"{cfg.trainer.method}/{cfg.trainer.finetune}",
        llm_persona_url=llm_persona_url, llm_persona_model=llm_persona_model, feedback=feedback_path,
        eval_prompts=eval_prompts, model=cfg.engine.served_name, engine_kind=cfg.engine.kind,
        peers=not no_peers, short_is_broken=short_answers == "broken",
        engine_id=_engine_id(cfg) if system else "",
    )
    if users is not None:
        _run_users(settings, users, cfg, system, out_dir, data_dir)
        return
    table = LiveTable()
    try:
        with terminate_unwinds():  # SIGTERM stops the system this command started
            curve = asyncio.run(run_sim(settings, on_point=lambda p: table.add(settings.method, p)))
    except ClawproxyError as e:
        raise click.ClickException(e.message) from e
    finally:
        if system is not None:
            system.stop()
    out = Path(out_dir or Path(data_dir or ".") / "simulate")
    j = write_json(out / "curve.json", [curve])
    p = plot_png(out / "curve.png", [curve], title=f"persona: {make_persona(persona).name}")
    if curve.judge_agreement:
        a = curve.judge_agreement
        click.echo(f"judge vs the simulator's intended verdicts: right {a['right']}, zero {a['zero']}, "
                   f"wrong sign {a['wrong']}, unjudged {a['unjudged']}")
    if curve.samples:
        trained = sum(v for k, v in curve.samples.items() if k.startswith("trained"))
        click.echo(f"interactions -> training samples: {trained} of {sum(curve.samples.values())} trained; "
                   + ", ".join(f"{k} {v}" for k, v in curve.samples.items()))
    for line in peer_lines(curve):
        click.echo(line)
    click.echo(f"wall {curve.wall_s:.0f}s; curve: {j}  plot: {p}")


def _engine_id(cfg) -> str:
    """What the base model's greedy answers depend on: engine, model, dtype, quantization and the
    CPU's bfloat16 (``auto`` resolves by it)."""
    from clawproxy.config import cpu_has_bf16

    e = cfg.engine
    return f"{e.kind}:{e.model}:{e.dtype}:{e.quantization}:{e.device}:bf16={cpu_has_bf16()}"


def peer_lines(curve) -> list[str]:
    """The peer measures and the trying report, a line each, for a person reading the run's end."""
    out = []
    pe, t = curve.peers, curve.trying
    if pe.get("effort"):
        out.append(f"user effort (complaints about the preference per 12 interactions): "
                   f"{' / '.join(str(x) for x in pe['effort'])}; any complaint: "
                   f"{' / '.join(str(x) for x in pe.get('complaints', []))}")
        out.append("streak (3 conversations in a row met it) from interaction: "
                   f"{pe['streak_at'] if pe.get('streak_at') else 'not reached'}")
    if "told" in pe:
        out.append(f"told baseline (the base model told the preference plainly): {pe['told']:.2f} held-out adoption, "
                   f"{pe.get('told_words')} words")
    cap = pe.get("capability") or {}
    if "base" in cap:
        out.append(f"capability (right of {cap['tasks']}): base {cap['base']}, at the end "
                   f"{cap.get('final', '-')}; degenerate at the end {curve.points[-1].degenerate_share:.2f}")
    if t:
        out.append(f"learning by trying: {t.get('tried')} of {t.get('answers')} answers tried; found at interaction "
                   f"{t.get('found_at') if t.get('found_at') is not None else '-'}; served adoption "
                   f"{t.get('served_adoption')}, after the find {t.get('served_adoption_after_found')}")
        for pref in t.get("preferences") or []:
            out.append(f"  {pref['status']:<9} {pref['source']:<6} tries {pref['tries']} good {pref['good']} "
                       f"bad {pref['bad']}: {pref['text']}")
    return out


def _add_users(data_dir, personas, share, cfg=None):
    """The simulated users in the system's store (a started system: before it starts, so the proxy
    knows their keys from its first read)."""
    from clawproxy.errors import ClawproxyError
    from clawproxy.simulate.multi import add_users

    if cfg is not None:
        # the trainer refuses users otherwise (trainer/loop.py _check_users): say so before starting
        if cfg.trainer.enabled and (cfg.trainer.finetune != "lora" or not cfg.engine.spec.adapters_by_name):
            raise click.UsageError(
                f"--users: each user trains a LoRA adapter of their own, served side by side by vLLM or "
                f"llama.cpp; this config has trainer.finetune {cfg.trainer.finetune} and engine.kind "
                f"{cfg.engine.kind}. Use --lora with a vLLM engine (the default config) or engine.kind "
                "llamacpp, or a config with trainer.enabled: false.")
    try:
        return add_users(data_dir, personas, share)
    except ClawproxyError as e:
        raise click.ClickException(e.message) from e


def _run_users(settings, users, cfg, system, out_dir, data_dir) -> None:
    """Several users: a curve each, cross-talk, one curve.json and a table."""
    import asyncio

    from clawproxy.errors import ClawproxyError
    from clawproxy.simulate.measure import LiveTable, plot_png, write_json
    from clawproxy.simulate.multi import print_table, simulate_users, summary
    from clawproxy.stop import terminate_unwinds

    table = LiveTable()
    try:
        with terminate_unwinds():  # SIGTERM stops the system this command started
            curves = asyncio.run(simulate_users(settings, users, max_staleness=cfg.trainer.max_staleness,
                                                on_point=lambda u, p: table.add(u.name, p)))
    except ClawproxyError as e:
        raise click.ClickException(e.message) from e
    finally:
        if system is not None:
            system.stop()
    out = Path(out_dir or Path(data_dir or ".") / "simulate")
    j = write_json(out / "curve.json", curves, summary(curves))
    p = plot_png(out / "curve.png", curves, title="users: " + ", ".join(f"{u.name}" for u in users))
    print_table(curves)
    for c in curves:
        if c.judge_agreement:
            a = c.judge_agreement
            click.echo(f"{c.user}: judge vs the simulator's intended verdicts: right {a['right']}, zero {a['zero']}, "
                       f"wrong sign {a['wrong']}, unjudged {a['unjudged']}")
    click.echo(f"wall {curves[0].wall_s:.0f}s; curve: {j}  plot: {p}")
