"""One trainer step on recorded samples, with tree packing and without: time, peak memory, and
whether the two steps agree.

    .venv/bin/python bench/pack_step.py --data-dir DIR [--config configs/default.yaml] [--out FILE]

DIR is a clawproxy data dir whose store holds judged turns waiting to train (an `agent_learn` or
`simulate` run). Each mode copies DIR (store and checkpoints) to a scratch dir and runs the real
Trainer's next step there, without an engine, in its own process, so its peak RSS is its own and
both steps start from the same weights and the same batch. It prints one JSON line per mode and
one for the comparison: train seconds, tokens in the batch, tokens the policy pass computed,
passes, loss, grad norm, kl_behaviour and the published adapter's largest difference.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _env import ROOT


def run_one(data_dir: Path, config: str | None, pack: bool, threads: int | None) -> dict:
    from clawproxy.config import load_config
    from clawproxy.store import Store
    from trainer.loop import Trainer

    overrides = {"data_dir": str(data_dir), "trainer.pack_prefixes": pack}
    if threads:
        overrides["trainer.threads"] = threads
    cfg = load_config(config, overrides)
    store = Store(cfg.db_path)
    trainer = Trainer(cfg, store)
    batch = trainer.collect()
    r = trainer.step(batch)
    m = r.metrics
    keys = ("train_s", "samples", "tokens", "forwarded_tokens", "passes", "completion_tokens", "loss", "grad_norm",
            "kl_behaviour", "ratio_mean", "clip_frac", "opd_samples", "kinds")
    return {"pack": pack, "status": r.status, "version": r.new_version,
            "turns": [s.turn_id for s in batch.samples], **{k: m.get(k) for k in keys},
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def max_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    wa, wb = load_file(str(a)), load_file(str(b))
    return max(float((wa[k].float() - wb[k].float()).abs().max()) for k in wa)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    p.add_argument("--modes", default="packed,unpacked")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--one", choices=["packed", "unpacked"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args.data_dir, args.config, args.one == "packed", args.threads)))
        return
    scratch = Path(tempfile.mkdtemp(prefix="bench-pack-"))
    rows = []
    for mode in args.modes.split(","):
        d = scratch / mode
        shutil.copytree(args.data_dir, d, ignore=shutil.ignore_patterns("*.sock", "journal.bin"))
        cmd = [sys.executable, __file__, "--one", mode, "--data-dir", str(d), "--config", args.config]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            sys.exit(f"{mode} failed:\n{out.stderr[-3000:]}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["adapter"] = str(d / "checkpoints" / f"v{row['version']}" / "adapter_model.safetensors")
        rows.append(row)
        print(json.dumps(row), flush=True)
    if len(rows) == 2:
        a, b = rows
        cmp = {"same_batch": a["turns"] == b["turns"], "speedup": b["train_s"] / a["train_s"],
               "loss_diff": abs(a["loss"] - b["loss"]), "grad_norm_diff": abs(a["grad_norm"] - b["grad_norm"])}
        if Path(a["adapter"]).exists() and Path(b["adapter"]).exists():
            cmp["adapter_max_diff"] = max_diff(Path(a["adapter"]), Path(b["adapter"]))
        print(json.dumps(cmp), flush=True)
        rows.append(cmp)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
