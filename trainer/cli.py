"""`clawproxy train`, `clawproxy rollback`, `clawproxy stats`.

Only light imports at module level: torch and the trainer load inside the commands.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import click

from clawproxy.cli_options import CONTEXT_SETTINGS as CONTEXT
from clawproxy.cli_options import build_config, config_options, make_console

if TYPE_CHECKING:
    from clawproxy.engine.client import EngineClient


def _engine(cfg: Any, engine_url: str | None, store: Any = None) -> EngineClient | None:
    """An EngineClient for ``--engine-url`` (None: no engine, publish to disk only)."""
    if not engine_url:
        return None
    from clawproxy.engine.client import EngineClient
    from clawproxy.errors import EngineError

    initial = 0
    if store is not None and not cfg.engine.spec.reports_weight_version:
        from trainer.checkpoints import current_version

        initial = current_version(store, cfg.engine.model).version
    client = EngineClient(engine_url, kind=cfg.engine.kind, token=cfg.engine.control_token, initial_version=initial)
    try:
        client.check(lora=cfg.trainer.finetune == "lora")
    except EngineError as e:
        raise click.ClickException(e.message) from e
    return client


def _format_step(r: Any) -> str:
    m = r.metrics
    skipped = ", ".join(f"{k} {v}" for k, v in sorted(m.get("skipped", {}).items())) or "-"
    head = {
        "published": f"v{r.base_version} -> v{r.new_version}",
        "gate_failed": f"v{r.base_version} refused ({', '.join(m['gate']['failed'])})",
        "error": (f"v{r.base_version} checkpoint not written ({m['save_error']})" if "save_error" in m
                  else f"v{r.base_version} engine refused"),
        "superseded": f"v{r.base_version} dropped (a rollback was published while it trained)",
        "user_removed": f"v{r.base_version} dropped (its user was removed while it trained)",
    }[r.status]
    return (
        f"step {r.step_id}: {head} | loss {m['loss']:+.4f} adv {m['adv_mean']:+.3f} "
        f"clip {m['clip_frac']:.3f} kl {m['kl']:.4f} |g| {m['grad_norm']:.3f} lr {m.get('lr', 0.0):.1e} "
        f"{m['tokens_per_s']:.0f} tok/s | {m['samples']} samples (score {m['score_mean']:+.2f}, "
        f"{m['opd_samples']} hinted) | skipped: {skipped}"
    )


@click.command(context_settings=CONTEXT)
@config_options
@click.option("--engine-url", default=None,
              help="Engine to publish to (e.g. http://127.0.0.1:8081). Without it checkpoints are "
                   "written and recorded but nothing is reloaded.")
@click.option("--follow", is_flag=True, help="Keep waiting for new judged turns (what `clawproxy start` runs).")
@click.option("--steps", type=int, default=None, help="Stop after N optimizer steps.")
@click.option("--method", type=click.Choice(["rl", "opd", "combined"]), default=None, help="Override trainer.method.")
@click.option("--lora", "finetune", flag_value="lora", default=None, help="Train a LoRA adapter.")
@click.option("--full", "finetune", flag_value="full", help="Full fine-tuning.")
@click.option("--batch-size", type=int, default=None, help="Override trainer.batch_size.")
@click.option("--threads", type=int, default=None, help="Override trainer.threads (torch CPU threads).")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def train(config_path, data_dir, engine_url, follow, steps, method, finetune, batch_size, threads, verbose) -> None:
    """Train on judged turns and publish new weights to the engine.

    Each step waits for trainer.batch_size useful samples, takes one optimizer step, gates the
    result and publishes it as checkpoints/v<N>. Runs beside the engine, which keeps serving.
    """

    from clawproxy.errors import ClawproxyError
    from clawproxy.store import Store

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = build_config(config_path, data_dir, **{"trainer.method": method, "trainer.finetune": finetune,
                                            "trainer.batch_size": batch_size, "trainer.threads": threads})
    console = make_console(highlight=False)
    store = Store(cfg.db_path)
    last_wait = [-1]

    def on_wait(n: int) -> None:
        if n != last_wait[0]:
            console.print(f"waiting for samples: {n}/{cfg.trainer.batch_size} ready")
            last_wait[0] = n

    try:
        from trainer.loop import Trainer

        engine = _engine(cfg, engine_url, store)
        trainer = Trainer(cfg, store, engine)
        if not trainer.policy.accelerator.is_main_process:  # under accelerate launch: one process talks
            console.quiet = True
        console.print(f"training {cfg.trainer.method} ({cfg.trainer.finetune}) from v{trainer.current.version}")
        results = trainer.run(follow=follow, steps=steps,
                              on_step=lambda r: console.print(_format_step(r)), on_wait=on_wait)
    except ClawproxyError as e:
        store.log_event("trainer_error", {"error": e.message})
        raise
    except Exception as e:
        store.log_event("trainer_error", {"error": repr(e)})
        raise
    finally:
        store.close()
    if not results and not console.quiet:
        console.print(f"no full batch available ({cfg.trainer.batch_size} useful samples needed); nothing trained")


@click.command(context_settings=CONTEXT)
@click.argument("version", type=int, required=False)
@config_options
@click.option("--engine-url", default=None,
              help="Engine to reload (default: proxy.upstream, else engine.host:engine.port).")
@click.option("--no-engine", is_flag=True, help="Only record the rollback; the engine picks it up later.")
@click.option("--user", "user", default=None, metavar="NAME",
              help="Roll back this user's adapter (default: the shared one, the only one with no users).")
def rollback(version, config_path, data_dir, engine_url, no_engine, user) -> None:
    """Reload an earlier checkpoint into the engine (default: the one before the current).

    Recorded as a new weight version that points at the old weights, plus a rollback event; a
    running trainer follows it. Only one adapter's chain moves: the shared one, or ``--user``'s.
    """
    from clawproxy.engine.model import resolve_model
    from clawproxy.errors import ClawproxyError, ConfigError
    from clawproxy.store import Store
    from trainer.checkpoints import rollback as do_rollback
    from trainer.loop import local_model_dir

    cfg = build_config(config_path, data_dir)
    store = Store(cfg.db_path)
    if user is not None and store.get_user(user) is None:
        store.close()
        raise ConfigError(f"no user {user!r} in this data dir.")
    try:
        url = None if no_engine else (engine_url or cfg.engine_url)
        engine = _engine(cfg, url, store)
        base_dir = local_model_dir(resolve_model(cfg.engine.model, cfg.data_path))
        new, source = do_rollback(store, engine, base_dir, version, owner=user)
    except ClawproxyError as e:
        if no_engine:
            raise
        raise type(e)(f"{e.message} (is the engine running? --engine-url, or --no-engine)", status=e.status) from e
    finally:
        store.close()
    whose = "" if user is None else f" to {user}"
    click.echo(f"now serving v{new}{whose} = the weights of v{source.version} ({source.path})")


def collect_stats(store: Any, user: str | None = None) -> dict[str, Any]:
    """Per weight version: where it came from, samples trained into it, how the turns it served were
    judged, gate results of the steps that started from it; plus rollbacks and skip reasons.
    ``user``: only that user's turns, their adapter's steps and the versions that served them."""
    versions: dict[int, dict[str, Any]] = {0: {"version": 0, "source": "base", "status": "base"}}
    for r in store.checkpoints() if user is None else store.checkpoints_of(user):
        gate = r["gate"] or {}
        source = f"rollback to v{gate['rollback_of']}" if "rollback_of" in gate else f"step {r['step_id']}"
        versions[r["version"]] = {"version": r["version"], "source": source, "status": r["status"],
                                  "kind": r["kind"], "created_at": r["created_at"]}
    for v in versions.values():
        v.update(samples_trained=0, served_turns=0, judged_turns=0, mean_score=None,
                 steps_published=0, steps_gate_failed=0, steps_error=0)
    for version, n in store.samples_trained_per_version(user).items():
        if version in versions:
            versions[version]["samples_trained"] = n
    for r in store.served_turns_per_version(user):
        v = versions.setdefault(r["v"] or 0, {"version": r["v"] or 0, "source": "?", "status": "unknown",
                                              "samples_trained": 0, "steps_published": 0,
                                              "steps_gate_failed": 0, "steps_error": 0})
        v.update(served_turns=r["n"], judged_turns=r["judged"],
                 mean_score=round(r["mean"], 3) if r["mean"] is not None else None)
    for r in store.steps_per_base_version(user):
        if r["v"] in versions and f"steps_{r['status']}" in versions[r["v"]]:
            versions[r["v"]][f"steps_{r['status']}"] = r["n"]
    gate_failures = [
        {"step_id": r["id"], "base_version": r["base_version"], "created_at": r["created_at"],
         "failed": (r["metrics"] or {}).get("gate", {}).get("failed", [])}
        for r in store.gate_failed_steps(user)
    ]
    rollbacks = [{"ts": r["ts"], **(r["data"] or {})} for r in store.events_of("rollback")
                 if user is None or (r["data"] or {}).get("user") == user]
    if user is not None:
        return {"user": user, "current_version": store.latest_weight_version(user),
                "versions": [versions[k] for k in sorted(versions)], "gate_failures": gate_failures,
                "rollbacks": rollbacks, "judge": store.judge_summary(user, all_users=False),
                **store.training_counts_of(user)}
    return {
        "current_version": store.latest_weight_version(),
        "versions": [versions[k] for k in sorted(versions)],
        "gate_failures": gate_failures,
        "rollbacks": rollbacks,
        "judge": store.judge_summary(),
        "skipped_by_reason": store.skipped_by_reason(),
        "trained_by_kind": store.trained_by_objective(),
        "steps": sum(store.step_counts().values()),
    }


def plot_stats(data: dict[str, Any], path: str) -> None:
    """Per weight version: the mean judge score of the turns it served (is it getting better?)
    and the samples trained into it; refused gates and rollbacks are marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    versions = data["versions"]
    xs = [v["version"] for v in versions]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    scored = [(v["version"], v["mean_score"]) for v in versions if v.get("mean_score") is not None]
    if scored:
        ax.plot(*zip(*scored, strict=True), marker="o", color="tab:blue", label="mean judge score of served turns")
    ax.set_ylim(-1.05, 1.05)
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_xlabel("weight version")
    ax.set_ylabel("mean judge score")
    ax2 = ax.twinx()
    ax2.bar(xs, [v["samples_trained"] for v in versions], alpha=0.25, color="tab:orange",
            label="samples trained into this version")
    ax2.set_ylabel("samples trained")
    for v in versions:
        if v["steps_gate_failed"]:
            ax.annotate(f"{v['steps_gate_failed']} refused", (v["version"], -1.0), fontsize=7, ha="center")
        if v["source"].startswith("rollback"):
            ax.axvline(v["version"], color="tab:red", linestyle="--", linewidth=0.8)
    lines = ax.get_legend_handles_labels()
    bars = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + bars[0], lines[1] + bars[1], loc="upper left", fontsize=8)
    ax.set_title(f"clawproxy learning progress (serving v{data['current_version']}, {data['steps']} steps)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.command(context_settings=CONTEXT)
@config_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a PNG: mean judge score and samples trained per weight version.")
@click.option("--user", "user", default=None, metavar="NAME",
              help="Only this user's turns, adapter and versions (`clawproxy users` lists them).")
def stats(config_path, data_dir, as_json, plot_path, user) -> None:
    """Learning progress per weight version: samples trained, judge scores, gate results, rollbacks."""
    from rich.table import Table

    from clawproxy.simulate.measure import adoption_curves
    from clawproxy.store import Store

    cfg = build_config(config_path, data_dir)
    store = Store(cfg.db_path)
    try:
        if user is not None and store.get_user(user) is None:
            raise click.ClickException(f"no user {user!r}; `clawproxy users` lists them.")
        data = collect_stats(store, user)
        data["quarantined_turns"] = store.quarantine_count()  # turns the recorder could not store
        data["simulate"] = adoption_curves(cfg.data_path, user)  # the curve the dashboard draws
    finally:
        store.close()
    if plot_path:
        plot_stats(data, plot_path)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    if plot_path:
        click.echo(f"plot written to {plot_path}")
    whose = f" of {user}" if user else ""
    table = Table(title=f"weight versions{whose} (serving v{data['current_version']})")
    for col in ("version", "from", "status", "samples trained", "turns served", "judged", "mean score", "steps ok/refused"):
        table.add_column(col, justify="right" if col not in ("from", "status") else "left")
    for v in data["versions"]:
        score = "-" if v.get("mean_score") is None else f"{v['mean_score']:+.2f}"
        table.add_row(str(v["version"]), v["source"], v["status"], str(v["samples_trained"]),
                      str(v.get("served_turns", 0)), str(v.get("judged_turns", 0)), score,
                      f"{v['steps_published']}/{v['steps_gate_failed']}")
    console = make_console()
    console.print(table)
    j = data["judge"]
    console.print(f"judge: {j['judged']} turn(s) judged, {j['scored']} scored, {j['abstained']} abstained "
                  f"(a majority too unsure to train on), {j['neutral']} neutral")
    if data["gate_failures"]:
        console.print("gate failures: " + "; ".join(
            f"step {g['step_id']} from v{g['base_version']}: {', '.join(g['failed'])}" for g in data["gate_failures"]))
    if data["rollbacks"]:
        console.print("rollbacks: " + "; ".join(
            f"v{r.get('from')} -> weights of v{r.get('to')} as v{r.get('new_version')}" for r in data["rollbacks"]))
    if data["quarantined_turns"]:
        console.print(f"quarantined turns (not stored, kept with the reason in the store's "
                      f"quarantine table): {data['quarantined_turns']}")
    if data["trained_by_kind"]:
        console.print("trained samples by kind: " + ", ".join(
            f"{k or 'unrecorded'} {n}" for k, n in sorted(data["trained_by_kind"].items())))
    if data["skipped_by_reason"]:
        console.print("skipped samples: " + ", ".join(f"{k} {n}" for k, n in sorted(data["skipped_by_reason"].items())))
    for c in data["simulate"]:
        console.print(f"held-out adoption ({c['label']}, `clawproxy simulate`): " + ", ".join(
            f"{p['x']} -> {p['y']:.2f}" for p in c["points"]))
