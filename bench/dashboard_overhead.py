"""Does watching the proxy slow it down? Added latency with the dashboard closed and open, one run.

    .venv/bin/python bench/dashboard_overhead.py [--rounds 3] [--tabs 3] [--hz 2]
        [--poll /metrics,/clawproxy/ui/,/clawproxy/ui/api/live,/clawproxy/ui/api/learning]

The fake upstream and the proxy run as in bench/proxy_overhead.py (own processes, recording on),
over a store seeded with judged turns, votes and train steps so that every /metrics scrape does
real reads. "Open" means ``--tabs`` pollers in a separate process, each fetching every ``--poll``
URL ``--hz`` times a second (a live-updating page per tab); URLs the proxy does not serve (404)
are left out and named. Each round measures closed then open, with the same load:

1. C=1 unpaced, 64 chunks: p50/p99 added latency per request (proxy minus direct).
2. C=16 paced (20 ms x 64 chunks): p50/p99 added latency per chunk.

Figures are medians over rounds. Beside them, the proxy's own view: quantiles of its
``clawproxy_added_seconds`` histogram over each phase (interpolated within buckets, as Prometheus'
``histogram_quantile``), and the poller's request times.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
from _env import reserve_port
from prometheus_client.parser import text_string_to_metric_families
from proxy_overhead import Bench, _drain, _pct, _start

from clawproxy.store import Store
from tests.net import wait_ok

DEFAULT_POLL = "/metrics,/clawproxy/ui/,/clawproxy/ui/api/live,/clawproxy/ui/api/learning"  # a tab's reads


def seed_store(path: Path, turns: int) -> None:
    """Judged turns with 3 votes each, some skipped, one train step per 16 turns, checkpoints."""
    store = Store(path)
    now = time.time()
    with store.transaction():
        store.insert("sessions", {"id": "seed", "source": "header", "first_seen": now, "last_seen": now})
        for i in range(turns):
            tid = store.insert("turns", {
                "request_id": f"seed-{i}", "session_id": "seed", "turn_index": i, "created_at": now - turns + i,
                "path": "/v1/chat/completions", "kind": "main", "status": "ok", "trainable": 1, "reason": "ok",
                "request_messages": [{"role": "user", "content": f"question {i}"}],
                "response_text": "an answer " * 20, "completion_token_ids": list(range(40)),
                "next_state": [{"role": "user", "content": "thanks"}] if i < turns - 1 else None,
            })
            score = (1, -1, 0)[i % 3]
            for k in range(3):
                store.insert("votes", {"turn_id": tid, "idx": k, "voter": "embedding", "score": score,
                                       "created_at": now})
            store.insert("judgments", {"turn_id": tid, "score": score, "voter": "embedding", "created_at": now})
            if score == 0:
                store.insert("skipped_samples", {"turn_id": tid, "reason": "score_0", "created_at": now})
    for v in range(1, turns // 16 + 1):
        ids = list(range((v - 1) * 16 + 1, v * 16 + 1))
        store.record_step(method="combined", base_version=v - 1, new_version=v, status="published",
                          metrics={"loss": 0.1, "kl": 0.01, "reload_s": 0.6}, objectives=dict.fromkeys(ids, "rl"),
                          checkpoint={"path": f"/seed/v{v}", "format": "full", "gate": {}, "engine": True})
    store.close()


# -- the poller (its own process: its CPU is not the load client's) ----------------------------------
async def poll_main(base: str, urls: list[str], tabs: int, hz: float) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    times: dict[str, list[float]] = {u: [] for u in urls}
    async with aiohttp.ClientSession() as s:
        live = []
        for u in urls:
            async with s.get(base + u) as r:
                await r.read()
                (live if r.status == 200 else []).append(u)
                if r.status != 200:
                    print(f"SKIP {u} {r.status}", flush=True)
        print("READY", flush=True)

        async def tab(i: int) -> None:
            await asyncio.sleep(i / (tabs * hz))  # tabs opened at different moments
            while not stop.is_set():
                t_next = time.monotonic() + 1 / hz
                for u in live:
                    t0 = time.perf_counter()
                    async with s.get(base + u) as r:
                        await r.read()
                    times[u].append(time.perf_counter() - t0)
                pause = max(0.0, t_next - time.monotonic())
                try:
                    await asyncio.wait_for(stop.wait(), pause)
                except TimeoutError:
                    pass

        async with asyncio.TaskGroup() as tg:
            for i in range(tabs):
                tg.create_task(tab(i), name=f"poll-tab-{i}")
    print(orjson.dumps({u: v for u, v in times.items() if v}).decode(), flush=True)


class Poller:
    def __init__(self, base: str, urls: list[str], tabs: int, hz: float):
        self.args = [sys.executable, __file__, "--poller", base, "--poll", ",".join(urls),
                     "--tabs", str(tabs), "--hz", str(hz)]
        self.times: dict[str, list[float]] = {}
        self.skipped: list[str] = []

    def __enter__(self) -> Poller:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True)
        while (line := self.proc.stdout.readline()).startswith("SKIP"):
            self.skipped.append(line.split()[1])
        if line.strip() != "READY":
            raise RuntimeError(f"poller did not start: {line}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(30)
        for u, v in orjson.loads(out.strip().splitlines()[-1]).items():
            self.times.setdefault(u, []).extend(v)


# -- the proxy's own histogram ---------------------------------------------------------------------
async def added_buckets(s: aiohttp.ClientSession, proxy: str) -> dict[float, float]:
    """upper bound -> cumulative count of clawproxy_added_seconds for chat completions."""
    async with s.get(proxy + "/metrics") as r:
        text = await r.text()
    return {float(x.labels["le"]): x.value for fam in text_string_to_metric_families(text)
            for x in fam.samples if x.name == "clawproxy_added_seconds_bucket"
            and x.labels["route"] == "/v1/chat/completions"}


def hist_quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float:
    """The q-quantile of what was observed between two scrapes, in ms (histogram_quantile's rule)."""
    bounds = sorted(after)
    cum = [after[b] - before.get(b, 0.0) for b in bounds]
    rank = q * cum[-1]
    lo, below = 0.0, 0.0
    for b, c in zip(bounds, cum, strict=True):
        if c >= rank:
            if b == float("inf"):
                return lo * 1e3
            return (lo + (b - lo) * (rank - below) / max(c - below, 1e-9)) * 1e3
        lo, below = b, c
    return lo * 1e3


# -- the load ----------------------------------------------------------------------------------------
async def measure(b: Bench, s: aiohttp.ClientSession, direct: str, proxy: str, args: argparse.Namespace,
                  ) -> dict[str, float]:
    d_lat, p_lat = [], []
    for _ in range(args.c1_requests):
        d_lat.append((await b.one(s, direct, 64, 0))[0])
        p_lat.append((await b.one(s, proxy, 64, 0))[0])
    d_chunk: list[float] = []
    p_chunk: list[float] = []
    await b.run(s, direct, args.paced_streams, 1, 64, 20, d_chunk)
    await b.run(s, proxy, args.paced_streams, 1, 64, 20, p_chunk)
    return {"c1_p50": (_pct(p_lat, .5) - _pct(d_lat, .5)) * 1e3,
            "c1_p99": (_pct(p_lat, .99) - _pct(d_lat, .99)) * 1e3,
            "chunk_p50": _pct(p_chunk, .5) - _pct(d_chunk, .5),
            "chunk_p99": _pct(p_chunk, .99) - _pct(d_chunk, .99)}


async def main_async(args: argparse.Namespace) -> None:
    urls = [u.strip() for u in args.poll.split(",") if u.strip()]
    load0 = Path("/proc/loadavg").read_text().split()[0]
    py = sys.executable
    data_dir = Path(tempfile.mkdtemp(prefix="clawproxy-bench-"))
    seed_store(data_dir / "clawproxy.db", args.seed_turns)
    up_proc, up_port = _start([py, "-m", "tests.rig.fake_upstream", "--port", "0"], "PORT")
    upstream = f"http://127.0.0.1:{up_port}"
    pport = reserve_port()
    px_proc, _ = _start([py, "-m", "clawproxy.proxy", "--upstream", upstream, "--port", str(pport),
                         "--data-dir", str(data_dir), "--log-level", "WARNING"])
    proxy = f"http://127.0.0.1:{pport}"
    direct_url, proxy_url = upstream + "/v1/chat/completions", proxy + "/v1/chat/completions"
    b = Bench(args.body_kb, upstream)
    res: dict[str, dict[str, list[float]]] = {"closed": {}, "open": {}}
    poll_times: dict[str, list[float]] = {}
    skipped: list[str] = []
    try:
        await wait_ok(proxy + "/clawproxy/health")
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=120)) as s:
            async with s.get(proxy + "/metrics") as r:  # the seeded store is what it reads
                assert r.status == 200 and b"clawproxy_judge_votes_total" in await r.read()
            for url in (direct_url, proxy_url):
                await b.run(s, url, 8, 5, 64, 0)
            for rnd in range(args.rounds):
                for mode in ("closed", "open"):
                    await _drain(s, proxy)
                    h0 = await added_buckets(s, proxy)
                    if mode == "open":
                        with Poller(proxy, urls, args.tabs, args.hz) as p:
                            fig = await measure(b, s, direct_url, proxy_url, args)
                        skipped = p.skipped
                        for u, v in p.times.items():
                            poll_times.setdefault(u, []).extend(v)
                    else:
                        fig = await measure(b, s, direct_url, proxy_url, args)
                    h1 = await added_buckets(s, proxy)
                    fig["own_p50"], fig["own_p99"] = hist_quantile(.5, h0, h1), hist_quantile(.99, h0, h1)
                    for k, v in fig.items():
                        res[mode].setdefault(k, []).append(v)
                    print(f"round {rnd + 1} {mode}: " + ", ".join(f"{k}={v:.3f}" for k, v in fig.items()),
                          flush=True)
    finally:
        for p in (px_proc, up_proc):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()

    polled = [u for u in urls if u not in skipped]
    print()
    print(f"dashboard overhead, medians over {args.rounds} rounds (store seeded with {args.seed_turns} "
          f"judged turns; open = {args.tabs} tabs x {args.hz:g} Hz polling {', '.join(polled)}"
          + (f"; not served, left out: {', '.join(skipped)}" if skipped else "") + "):")
    for mode in ("closed", "open"):
        med = {k: statistics.median(v) for k, v in res[mode].items()}
        print(f"  {mode:6}: C=1 unpaced added p50 {med['c1_p50']:.3f} ms, p99 {med['c1_p99']:.3f} ms; "
              f"C={args.paced_streams} paced per chunk added p50 {med['chunk_p50']:.3f} ms, "
              f"p99 {med['chunk_p99']:.3f} ms; the proxy's own histogram, per request: p50 "
              f"{med['own_p50']:.3f} ms, p99 {med['own_p99']:.3f} ms")
    for u, v in poll_times.items():
        print(f"  poll {u}: {len(v)} requests, p50 {_pct(v, .5) * 1e3:.2f} ms, p99 {_pct(v, .99) * 1e3:.2f} ms")
    print(f"  machine: {os.cpu_count()} CPUs, load average {load0} at start, "
          f"{Path('/proc/loadavg').read_text().split()[0]} at end")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tabs", type=int, default=3, help="dashboard tabs open, each polling")
    ap.add_argument("--hz", type=float, default=2.0, help="polls per second per tab")
    ap.add_argument("--poll", default=DEFAULT_POLL,
                    help=f"comma-separated proxy paths each tab fetches per poll (default {DEFAULT_POLL})")
    ap.add_argument("--seed-turns", type=int, default=5000, help="judged turns in the store beforehand")
    ap.add_argument("--body-kb", type=int, default=8, help="size of the request's system prompt")
    ap.add_argument("--c1-requests", type=int, default=100)
    ap.add_argument("--paced-streams", type=int, default=16)
    ap.add_argument("--poller", metavar="BASE_URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.poller:
        asyncio.run(poll_main(args.poller, args.poll.split(","), args.tabs, args.hz))
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
