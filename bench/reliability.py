"""Reliability figures for the recording proxy (issue 15): kills, load, fuzz, faults.

    .venv/bin/python bench/reliability.py [--trials 50] [--fuzz 2000] [--clients 64 --requests 20]
                                          [--components] [--only sigkill,load,fuzz,faults]

Everything runs as real processes on loopback: the fake upstream (tests/rig/fake_upstream.py)
and ``python -m clawproxy.proxy``; this process is the client.

- sigkill: each trial starts the proxy, runs 4 slow streams in the background and one probe, and
  SIGKILLs the proxy 0-20 ms after the probe's [DONE]. After all trials the proxy starts once more
  (replaying its journal); every stream whose client saw [DONE] must be in the store, once.
- load: clients x requests streamed turns through one proxy; all must be stored; proxy RSS.
- fuzz: the hypothesis fuzz of tests/proxy/test_reliability_proc.py (bodies, raw bodies,
  headers, paths, upstream streams), N cases in all: proxy-originated 5xx, error answers that are
  not JSON, hangs, and whether every chat request the proxy took is in the store or quarantined.
- faults: the reliability and durability tests (upstream cut/garbage/down, full disk, bad
  records, secrets); with --components also the judge, trainer and engine fault tests.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.rig.proc_rig import (  # noqa: E402
    FakeProc,
    ProxyProc,
    chat_body,
    store_counts,
    store_texts,
    stream_until_done,
)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def sigkill(fake: FakeProc, trials: int, work: Path) -> dict:
    data = work / "sigkill"
    proxy = ProxyProc(fake.url, data)
    finished: list[str] = []
    delays = []
    for i in range(trials):
        proxy.start()
        done_at: dict[str, float] = {}

        def bg(word: str, done_at: dict[str, float] = done_at) -> None:
            # Back to back, of varied length: some finish just before the kill, some are cut.
            try:
                for n in range(100):
                    stream_until_done(proxy.port, chat_body(f"{word}n{n}"), [
                        (b"x-fake-chunks", str(random.randint(1, 12)).encode()),
                        (b"x-fake-delay-ms", str(random.randint(0, 3)).encode())])
                    done_at[f"{word}n{n}"] = time.monotonic()
            except Exception:
                pass  # killed mid-stream: not a finished turn

        threads = [threading.Thread(target=bg, args=(f"bg{i}x{k}z{random.randrange(10**9)}",))
                   for k in range(4)]
        for t in threads:
            t.start()
        time.sleep(random.uniform(0, 0.03))
        probe = f"probe{i}z{random.randrange(10**9)}"
        stream_until_done(proxy.port, chat_body(probe), [(b"x-fake-chunks", b"6")])
        t_done = time.monotonic()
        done_at[probe] = t_done
        delay = random.choice([0.0, random.uniform(0, 0.020)])
        if delay:
            time.sleep(delay)
        t_kill = time.monotonic()
        proxy.kill(signal.SIGKILL)
        delays.append((t_kill - t_done) * 1000)
        for t in threads:
            t.join(30)
        finished += [w for w, t in done_at.items() if t < t_kill]
    proxy.start()
    proxy.wait_idle()
    proxy.stop()
    # Whole words: "...n1" is a substring of "...n10", which would hide a loss or fake a duplicate.
    seen = Counter(w for t in store_texts(data / "clawproxy.db") for w in t.split())
    lost = [w for w in finished if not seen[w]]
    dup = sum(1 for w in finished if seen[w] > 1)
    from clawproxy.store import Store

    st = Store(data / "clawproxy.db")
    integrity = st.query_one("PRAGMA integrity_check")["integrity_check"]
    st.close()
    return {"trials": trials, "finished_turns": len(finished), "lost": len(lost),
            "duplicated": dup, "integrity": integrity,
            "kill_after_done_ms": f"{min(delays):.1f}-{max(delays):.1f}"}


async def _load(port: int, clients: int, requests: int) -> int:
    import aiohttp

    ok = 0

    async def client(c: int, session: aiohttp.ClientSession) -> None:
        nonlocal ok
        for r in range(requests):
            async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                    data=chat_body(f"load{c}x{r}"),
                                    headers={"Content-Type": "application/json",
                                             "session_id": f"load{c}", "x-fake-chunks": "16"}) as resp:
                body = await resp.read()
                ok += resp.status == 200 and b"[DONE]" in body

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*[client(c, s) for c in range(clients)])
    return ok


def load(fake: FakeProc, clients: int, requests: int, work: Path) -> dict:
    data = work / "load"
    proxy = ProxyProc(fake.url, data)
    proxy.start()
    pid = proxy.proc.pid  # type: ignore[union-attr]
    rss0 = _rss_mb(pid)
    t = time.perf_counter()
    ok = asyncio.run(_load(proxy.port, clients, requests))
    took = time.perf_counter() - t
    s = proxy.wait_idle(120)
    rss1 = _rss_mb(pid)
    proxy.stop()
    turns, quarantined = store_counts(data / "clawproxy.db")
    return {"requests": clients * requests, "ok": ok, "stored": turns, "quarantined": quarantined,
            "lost": s["turns_lost"], "seconds": round(took, 1),
            "rss_mb_before_after": f"{rss0:.0f} -> {rss1:.0f}"}


def fuzz(fake: FakeProc, cases: int, work: Path) -> dict:
    per_test = max(1, cases // 5)
    os.environ["CLAWPROXY_FUZZ_EXAMPLES"] = str(per_test)
    import tests.proxy.test_reliability_proc as F

    counts = {"cases": 0, "errors": 0, "proxy_5xx": 0, "plain_text_errors": 0, "no_answer": 0,
              "failures": []}
    orig = F._check

    def check(status, out):
        counts["cases"] += 1
        if status is None:
            counts["no_answer"] += 1
        elif status == 500 or b'"message":"internal proxy error' in out:
            counts["proxy_5xx"] += 1
        counts["errors"] += status is not None and status >= 400
        counts["plain_text_errors"] += F.is_plain_error(status, out)
        orig(status, out)

    F._check = check
    data = work / "fuzz"
    proxy = ProxyProc(fake.url, data, "--set", "proxy.body_timeout_s=2", "--set", "proxy.extra_routes=[]")
    proxy.start()
    try:
        while counts["cases"] < cases and len(counts["failures"]) < 5:
            for name in ("test_fuzz_bodies", "test_fuzz_raw_bodies", "test_fuzz_headers",
                         "test_fuzz_paths", "test_fuzz_upstream_streams"):
                try:
                    getattr(F, name)(fuzz_proxy=proxy)
                except Exception as e:  # hypothesis re-raises the shrunk failing case
                    counts["failures"].append(f"{name}: {str(e)[:300]}")
        s = proxy.wait_idle(120)
    finally:
        proxy.stop()
    turns, quarantined = store_counts(data / "clawproxy.db")
    log = proxy.log.read_text(errors="replace")
    from clawproxy.store import Store

    st = Store(data / "clawproxy.db")
    reasons = [r["reason"][:80] for r in st.query("SELECT reason FROM quarantine")]
    st.close()
    return {**counts, "chat_requests": s["chat_requests"], "stored": turns,
            "quarantined": quarantined, "stranded_or_dropped": s["chat_requests"] - turns - quarantined,
            "spool": s["spool_records"], "lost": s["turns_lost"],
            "tracebacks_in_log": log.count("Traceback"), "log_kb": round(len(log) / 1024, 1),
            "quarantine_reasons": sorted(set(reasons))}


FAULT_TESTS = ["tests/proxy/test_reliability_records.py", "tests/proxy/test_reliability_requests.py",
               "tests/proxy/test_reliability_store.py", "tests/proxy/test_reliability_secrets.py",
               "tests/proxy/test_durability.py", "tests/proxy/test_errors.py"]
COMPONENT_TESTS = [
    "tests/judge/test_llm_voter.py::test_unreachable_endpoint_raises_so_the_turn_is_retried",
    "tests/judge/test_worker.py::test_killed_worker_resumes_without_loss_or_double_count",
    "tests/trainer/test_loop.py::test_steps_publish_checkpoints_and_restart_trains_nothing_twice",
    "tests/trainer/test_loop.py::test_a_full_disk_keeps_the_samples_and_the_served_weights",
    "tests/clawproxy/test_supervisor.py::test_engine_crash_gives_503_then_recovers",
    "tests/engine/test_engine_reload.py::test_bad_checkpoint_is_refused_and_old_weights_keep_serving",
]


def faults(components: bool) -> dict:
    out = {}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for node in FAULT_TESTS + (COMPONENT_TESTS if components else []):
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
                           cwd=REPO, env=env, capture_output=True, text=True)
        out[node] = (r.stdout.strip().splitlines() or ["?"])[-1]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--fuzz", type=int, default=2000)
    ap.add_argument("--components", action="store_true", help="also the judge/trainer/engine fault tests")
    ap.add_argument("--only", default="sigkill,load,fuzz,faults")
    a = ap.parse_args()
    only = set(a.only.split(","))
    fake = FakeProc()
    try:
        with tempfile.TemporaryDirectory(prefix="clawproxy-reliability-") as tmp:
            work = Path(tmp)
            if "sigkill" in only:
                print("sigkill:", sigkill(fake, a.trials, work), flush=True)
            if "load" in only:
                print("load:", load(fake, a.clients, a.requests, work), flush=True)
            if "fuzz" in only:
                print("fuzz:", fuzz(fake, a.fuzz, work), flush=True)
            if "faults" in only:
                for node, result in faults(a.components).items():
                    print(f"faults: {node}: {result}", flush=True)
    finally:
        fake.close()


if __name__ == "__main__":
    main()
