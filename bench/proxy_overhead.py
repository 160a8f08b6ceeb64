"""What does the recording proxy add? Direct vs through the proxy, same run, same fake upstream.

    .venv/bin/python bench/proxy_overhead.py [--rounds 3] [--body-kb 8]

The fake upstream (tests/rig/fake_upstream.py) and the proxy (``python -m clawproxy.proxy``,
recording on, token fields requested and stripped) each run in their own process; this process is
the client. Each scenario alternates direct and proxied runs; figures are medians over rounds.

1. C=1 unpaced, 64 chunks:  p50/p99 added latency, time-to-first-byte delta.
2. C=32 paced (20 ms x 64 chunks): p50/p99 added latency, proxy CPU seconds per 1000 chunks.
3. C=32 unpaced saturation: throughput (requests/s) through the proxy / direct.

Targets (issue 2): <= 1 ms p50 added unpaced and paced, <= 5 ms p99 added paced. Anchors measured
on the same kind of machine: nginx (proxy_buffering off) adds 0.11 ms p50, throughput ratio ~0.9;
LiteLLM adds ~50 ms p50, ratio ~0.01.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
from _env import reserve_port

from tests.net import wait_ok

REPO = Path(__file__).resolve().parents[1]
CLK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Bench:
    def __init__(self, body_kb: int, upstream: str):
        self.upstream = upstream
        self.system = ("You are a personal assistant running inside OpenClaw. " * 40)[: body_kb * 1024]
        self.n = 0

    def body(self, ask_tokens: bool) -> bytes:
        self.n += 1
        extra = {"logprobs": True, "return_token_ids": True} if ask_tokens else {}
        return orjson.dumps({**extra,
            "model": "fake-model", "stream": True, "stream_options": {"include_usage": True},
            "max_completion_tokens": 1024,
            "messages": [{"role": "system", "content": self.system},
                         {"role": "user", "content": f"[Sun 2026-11-29 23:01 UTC] request {self.n}"}],
        })

    async def one(self, session: aiohttp.ClientSession, url: str, chunks: int, delay_ms: int,
                  chunk_lat: list[float] | None = None) -> tuple[float, float, int]:
        """(total seconds, time to first byte, bytes); per-chunk delivery latency into chunk_lat.

        Direct requests ask for token ids and log-probs themselves, so the fake upstream does the
        same work in both runs and only the proxy's cost shows.
        """
        headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench",
                   "x-fake-chunks": str(chunks), "x-fake-delay-ms": str(delay_ms),
                   "session_id": f"bench-{self.n % 64}:0"}
        if chunk_lat is not None:
            headers["x-fake-stamp"] = "1"
        direct = "/clawproxy" not in url and url.startswith(self.upstream)
        t0 = time.perf_counter()
        async with session.post(url, data=self.body(direct), headers=headers) as r:
            first = await r.content.readany()
            t1 = time.perf_counter()
            n = len(first)
            buf = first
            while True:
                if chunk_lat is not None:
                    now = time.monotonic_ns()
                    events = buf.split(b"\n\n")
                    buf = events.pop()
                    for ev in events:
                        i = ev.find(b'"sent_ns":')
                        if i >= 0:
                            j = ev.index(b",", i)
                            chunk_lat.append((now - int(ev[i + 10 : j])) / 1e6)
                data = await r.content.readany()
                if not data:
                    break
                n += len(data)
                buf += data
        assert r.status == 200 and n > chunks * 50, (r.status, n)
        return time.perf_counter() - t0, t1 - t0, n

    async def run(self, session: aiohttp.ClientSession, url: str, conc: int, per_worker: int,
                  chunks: int, delay_ms: int, chunk_lat: list[float] | None = None
                  ) -> tuple[list[float], list[float], float]:
        lat: list[float] = []
        ttfb: list[float] = []

        async def worker() -> None:
            for _ in range(per_worker):
                t, f, _ = await self.one(session, url, chunks, delay_ms, chunk_lat)
                lat.append(t)
                ttfb.append(f)

        t0 = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for i in range(conc):
                tg.create_task(worker(), name=f"bench-worker-{i}")
        return lat, ttfb, time.perf_counter() - t0


def _start(cmd: list[str], ready: str | None = None, env: dict[str, str] | None = None,
           ) -> tuple[subprocess.Popen, str | None]:
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, **(env or {})})
    if ready is None:
        return p, None
    line = p.stdout.readline()
    if not line.startswith(ready):
        raise RuntimeError(f"{cmd} did not start: {line}{p.stdout.read()}")
    return p, line.split()[1]


async def _drain(s: aiohttp.ClientSession, proxy: str) -> None:
    """Wait until the recorder has caught up, so one scenario's backlog does not tax the next."""
    for _ in range(600):
        async with s.get(proxy + "/clawproxy/stats") as r:
            if (await r.json())["queue_depth"] == 0:
                break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # the last batch taken off the queue is still being written


async def main_async(args: argparse.Namespace) -> None:
    load0 = Path("/proc/loadavg").read_text().split()[0]
    py = sys.executable
    up_proc, up_port = _start([py, "-m", "tests.rig.fake_upstream", "--port", "0"], "PORT")
    upstream = f"http://127.0.0.1:{up_port}"
    pport = reserve_port()
    data_dir = tempfile.mkdtemp(prefix="clawproxy-bench-")
    px_proc, _ = _start([py, "-m", "clawproxy.proxy", "--upstream", upstream, "--port", str(pport),
                         "--data-dir", data_dir, "--log-level", "WARNING"],
                        env={"CLAWPROXY_EVENT_LOOP": args.event_loop})
    proxy = f"http://127.0.0.1:{pport}"
    direct_url, proxy_url = upstream + "/v1/chat/completions", proxy + "/v1/chat/completions"
    b = Bench(args.body_kb, upstream)
    results: dict[str, list[float]] = {}

    def note(k: str, v: float) -> None:
        results.setdefault(k, []).append(v)

    try:
        await wait_ok(proxy + "/clawproxy/health")
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as s:
            for url in (direct_url, proxy_url):  # warm up connections and code paths
                await b.run(s, url, 8, 5, 64, 0)
            for rnd in range(args.rounds):
                await _drain(s, proxy)
                # 1. C=1 unpaced: alternate direct/proxy request by request.
                d_lat, d_ttfb, p_lat, p_ttfb = [], [], [], []
                for _ in range(args.c1_requests):
                    t, f, _ = await b.one(s, direct_url, 64, 0)
                    d_lat.append(t)
                    d_ttfb.append(f)
                    t, f, _ = await b.one(s, proxy_url, 64, 0)
                    p_lat.append(t)
                    p_ttfb.append(f)
                note("c1_p50_added_ms", (_pct(p_lat, .5) - _pct(d_lat, .5)) * 1e3)
                note("c1_p99_added_ms", (_pct(p_lat, .99) - _pct(d_lat, .99)) * 1e3)
                note("c1_ttfb_delta_ms", (_pct(p_ttfb, .5) - _pct(d_ttfb, .5)) * 1e3)
                note("c1_direct_p50_ms", _pct(d_lat, .5) * 1e3)

                await _drain(s, proxy)
                # 2. C=32 paced like a model: 20 ms between chunks. Added latency per chunk: the
                # upstream stamps each chunk, the client measures when it arrives.
                d_chunk: list[float] = []
                p_chunk: list[float] = []
                d_lat, _, _ = await b.run(s, direct_url, 32, args.paced_waves, 64, 20, d_chunk)
                cpu0 = _cpu_s(px_proc.pid)
                p_lat, _, _ = await b.run(s, proxy_url, 32, args.paced_waves, 64, 20, p_chunk)
                cpu = _cpu_s(px_proc.pid) - cpu0
                note("paced_p50_added_ms", _pct(p_chunk, .5) - _pct(d_chunk, .5))
                note("paced_p99_added_ms", _pct(p_chunk, .99) - _pct(d_chunk, .99))
                note("paced_direct_chunk_p50_ms", _pct(d_chunk, .5))
                note("paced_stream_p50_added_ms", (_pct(p_lat, .5) - _pct(d_lat, .5)) * 1e3)
                # 64 content chunks + role, finish, usage and [DONE] events per stream.
                note("paced_cpu_s_per_1000_chunks", cpu / (32 * args.paced_waves * 68 / 1000))

                await _drain(s, proxy)
                # 3. C=32 unpaced saturation.
                _, _, d_wall = await b.run(s, direct_url, 32, args.sat_per_worker, 64, 0)
                _, _, p_wall = await b.run(s, proxy_url, 32, args.sat_per_worker, 64, 0)
                n = 32 * args.sat_per_worker
                note("sat_direct_rps", n / d_wall)
                note("sat_proxy_rps", n / p_wall)
                note("sat_ratio", d_wall / p_wall)
                print(f"round {rnd + 1}: " + ", ".join(f"{k}={v[-1]:.3f}" for k, v in results.items()),
                      flush=True)
            async with s.get(proxy + "/clawproxy/stats") as r:
                stats = await r.json()
    finally:
        for p in (px_proc, up_proc):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()

    med = {k: statistics.median(v) for k, v in results.items()}
    print()
    print(f"proxy overhead, medians over {args.rounds} rounds (request body {args.body_kb} KB, "
          f"recording on, token fields requested and stripped, proxy event loop {args.event_loop}):")
    print(f"  C=1 unpaced 64 chunks : p50 added {med['c1_p50_added_ms']:.3f} ms, "
          f"p99 added {med['c1_p99_added_ms']:.3f} ms, TTFB delta {med['c1_ttfb_delta_ms']:.3f} ms "
          f"(direct p50 {med['c1_direct_p50_ms']:.2f} ms)   target <= 1 ms p50")
    print(f"  C=32 paced 20ms x 64  : p50 added {med['paced_p50_added_ms']:.3f} ms, "
          f"p99 added {med['paced_p99_added_ms']:.3f} ms per chunk (direct chunk p50 "
          f"{med['paced_direct_chunk_p50_ms']:.3f} ms; whole stream p50 added "
          f"{med['paced_stream_p50_added_ms']:.1f} ms), proxy CPU "
          f"{med['paced_cpu_s_per_1000_chunks']:.4f} s / 1000 chunks   target <= 1 / <= 5 ms")
    print(f"  C=32 unpaced          : {med['sat_proxy_rps']:.1f} req/s via proxy vs "
          f"{med['sat_direct_rps']:.1f} direct, ratio {med['sat_ratio']:.2f}   (nginx ~0.9, LiteLLM ~0.01)")
    print(f"  recorder: {stats['turns_recorded']} turns recorded, queue {stats['queue_depth']}, "
          f"spool {stats['spool_records']}, lost {stats['turns_lost']}")
    print(f"  machine: {os.cpu_count()} CPUs, load average {load0} at start, "
          f"{Path('/proc/loadavg').read_text().split()[0]} at end")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--body-kb", type=int, default=8, help="size of the request's system prompt")
    ap.add_argument("--c1-requests", type=int, default=150)
    ap.add_argument("--paced-waves", type=int, default=2, help="streams per worker in the paced run")
    ap.add_argument("--sat-per-worker", type=int, default=15)
    ap.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default="auto",
                    help="the proxy's event loop (CLAWPROXY_EVENT_LOOP; auto = uvloop when installed)")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
