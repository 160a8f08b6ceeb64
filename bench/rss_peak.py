"""Peak memory of groups of processes running together, sampled until interrupted (or --seconds).

    .venv/bin/python bench/rss_peak.py --group vllm='vllm.entrypoints|VLLM::' \
        --group trainer='clawproxy.cli train|trainer.cli' [--seconds N] [--out FILE]

Each group is the processes whose command line matches its regular expression (children of a
matching process count too: vLLM's engine core and worker). Every ``--interval`` seconds it sums
each group's RSS; it reports each group's peak and the peak of all groups' sum at the same instant
(what the machine had to hold), as one JSON line on SIGINT/SIGTERM or after ``--seconds``.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import time
from pathlib import Path

import psutil


def group_rss(patterns: dict[str, re.Pattern[str]]) -> dict[str, int]:
    """RSS per group now; a process belongs to the first group whose pattern matches it or an ancestor."""
    member: dict[int, str] = {}
    procs = list(psutil.process_iter(["pid", "ppid", "cmdline"]))
    for p in procs:
        cmd = " ".join(p.info["cmdline"] or [])
        for name, pat in patterns.items():
            if pat.search(cmd):
                member[p.info["pid"]] = name
                break
    by_pid = {p.info["pid"]: p for p in procs}
    out = dict.fromkeys(patterns, 0)
    for p in procs:
        pid, name = p.info["pid"], None
        seen = 0
        while pid and seen < 64 and name is None:  # walk up to a matching ancestor
            name = member.get(pid)
            parent = by_pid.get(pid)
            pid = parent.info["ppid"] if parent else 0
            seen += 1
        if name is None:
            continue
        try:
            out[name] += p.memory_info().rss
        except psutil.Error:
            pass
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--group", action="append", required=True, metavar="NAME=REGEX")
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--out", default=None, help="also write the JSON line here")
    args = ap.parse_args(argv)
    patterns = {}
    for g in args.group:
        name, _, regex = g.partition("=")
        if not name or not regex:
            ap.error(f"--group {g!r}: use NAME=REGEX")
        patterns[name] = re.compile(regex)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    peak = dict.fromkeys(patterns, 0)
    together, together_at = 0, None
    t0 = time.monotonic()
    while not stop and (args.seconds is None or time.monotonic() - t0 < args.seconds):
        now = group_rss(patterns)
        for k, v in now.items():
            peak[k] = max(peak[k], v)
        if sum(now.values()) > together:
            together, together_at = sum(now.values()), {k: round(v / 1e9, 2) for k, v in now.items()}
        time.sleep(args.interval)
    line = json.dumps({"peak_gb": {k: round(v / 1e9, 2) for k, v in peak.items()},
                       "together_peak_gb": round(together / 1e9, 2), "together_at_peak_gb": together_at,
                       "seconds": round(time.monotonic() - t0)})
    print(line, flush=True)
    if args.out:
        Path(args.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
