"""Secrets on disk (issue 25): every secret shape of tests/rig/secret_shapes.py sent through the real
proxy process, then the whole data dir, the proxy's log and an export grepped for each value.

    .venv/bin/python bench/secrets_probe.py [--rounds 3] [--out bench/results/secrets-probe.json]

While the turns stream, a sampler thread reads journal.bin, the database and its WAL every few ms
(what a crash, or a backup, would catch). Once per round the proxy is SIGKILLed right after a
[DONE], and journal.bin as the kill left it is grepped too; the next start replays it.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.rig.proc_rig import FakeProc, ProxyProc, store_counts, stream_until_done  # noqa: E402
from tests.rig.secret_shapes import shapes  # noqa: E402


def _found(secrets: dict[str, str], data: bytes) -> set[str]:
    return {label for label, s in secrets.items() if s.encode() in data}


def probe(rounds: int, work: Path) -> dict:
    data = work / "data"
    fake = FakeProc()
    proxy = ProxyProc(fake.url, data)
    rng = random.Random(25)
    cases = [c for _ in range(rounds) for c in shapes(rng)]
    secrets = {f"{label}#{i}": s for i, (label, s, _) in enumerate(cases)}
    found: dict[str, set[str]] = {}  # where -> labels
    samples = {"taken": 0, "with_secret": 0}
    stop = threading.Event()

    def sample() -> None:  # what a crash or a copy of the data dir would catch mid-traffic
        while not stop.is_set():
            hit = set()
            for name in ("journal.bin", "clawproxy.db-wal", "clawproxy.db"):
                try:
                    hit |= _found(secrets, (data / name).read_bytes())
                except OSError:
                    pass
            samples["taken"] += 1
            if hit:
                samples["with_secret"] += 1
                found.setdefault("sampled mid-traffic", set()).update(hit)
            time.sleep(0.002)

    proxy.start()
    sampler = threading.Thread(target=sample, name="sampler")
    sampler.start()
    killed = 0
    try:
        for i, (label, _, body) in enumerate(cases):
            stream_until_done(proxy.port, json.dumps(body).encode(),
                              [(b"x-session-id", f"{label}-{i}".encode()), (b"x-fake-chunks", b"8"),
                               (b"x-fake-delay-ms", b"2")])
            if (i + 1) % (len(cases) // rounds) == 0:  # once per round, right after a [DONE]
                proxy.kill(signal.SIGKILL)
                killed += 1
                left = (data / "journal.bin").read_bytes() if (data / "journal.bin").exists() else b""
                if hit := _found(secrets, left):
                    found.setdefault("journal.bin after SIGKILL", set()).update(hit)
                proxy.start()  # replays the journal
        proxy.wait_idle(60)
    finally:
        stop.set()
        sampler.join()
        proxy.stop()
        fake.close()
    export = subprocess.run([sys.executable, "-m", "clawproxy.cli", "sessions", "export", "--data-dir",
                             str(data)], cwd=REPO, capture_output=True, check=True).stdout
    for where, blob in [("export", export), ("proxy log", proxy.log.read_bytes()),
                        *((p.relative_to(data).as_posix(), p.read_bytes()) for p in data.rglob("*") if p.is_file())]:
        if hit := _found(secrets, blob):
            found.setdefault(where, set()).update(hit)
    leaked = set().union(*found.values()) if found else set()
    return {
        "shapes": len(cases) // rounds, "rounds": rounds, "secrets_sent": len(secrets),
        "turns_in_store": store_counts(data / "clawproxy.db")[0], "sigkills": killed,
        "samples_taken": samples["taken"], "samples_with_a_secret": samples["with_secret"],
        "secrets_found": len(leaked),
        "shapes_found": sorted({k.split("#")[0] for k in leaked}),
        "found_in": {where: len(labels) for where, labels in sorted(found.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="also write the figures here (JSON)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="clawproxy-secrets-") as tmp:
        res = probe(a.rounds, Path(tmp))
    print(json.dumps(res, indent=2))
    if a.out:
        a.out.write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
