"""Durability: the store failing (spool + replay) and the proxy process being SIGKILLed."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from clawproxy.store import Store
from tests.net import held_port, wait_ok
from tests.proxy.test_proxy_forwarding import _body
from tests.rig.fake_upstream import FakeUpstream
from tests.waits import until

REPO = Path(__file__).resolve().parents[2]
BIG = " filler" * 4000  # needs new pages: a full database cannot take it


def disk_full(rig, full: bool) -> None:
    """The recorder's database is full (SQLite's own limit, so the error is the real one)."""
    from clawproxy.proxy.app import RECORDER_KEY

    store = rig.app[RECORDER_KEY].store
    n = store.query_one("PRAGMA page_count")["page_count"] if full else 1 << 30
    store.execute(f"PRAGMA max_page_count={n}")


async def test_store_down_spools_then_replays(make_rig, tmp_path, monkeypatch):
    from clawproxy.proxy.app import RECORDER_KEY

    db_dir = tmp_path / "data" / "clawproxy.db"
    db_dir.mkdir(parents=True)  # a directory where the database should be: the store cannot open
    rig = await make_rig()
    status, _, _ = await rig.chat(_body("while broken"), {"x-session-id": "sp"})
    assert status == 200  # the user's request does not care
    s = await rig.stats_when(lambda s: s["spool_records"] == 1, "the turn to be spooled")
    assert s["store_ok"] is False and s["spool_records"] == 1, s
    spool = tmp_path / "data" / "spool.jsonl"
    assert spool.exists() and oct(spool.stat().st_mode & 0o777) == "0o600"
    assert b"while broken" in spool.read_bytes()

    shutil.rmtree(db_dir)  # the store works again
    # The next batch tries to open it again (not 2 s later): when it retries is not this test's subject.
    monkeypatch.setattr(rig.app[RECORDER_KEY], "reopen_interval_s", 0.0)
    await rig.chat(_body("after repair"), {"x-session-id": "sp"})
    await rig.wait_recorded(2)
    st = Store(tmp_path / "data" / "clawproxy.db")
    try:
        rows = st.query("SELECT session_id, response_text, turn_index FROM turns ORDER BY turn_index")
    finally:
        st.close()
    assert [r["response_text"] for r in rows] == ["pong: while broken part1 part2 part3",
                                                  "pong: after repair part1 part2 part3"]
    assert not spool.exists() or not spool.read_bytes().strip()
    assert (await rig.stats())["spool_records"] == 0


async def test_spool_replayed_on_next_start(make_rig, tmp_path):
    db_dir = tmp_path / "data" / "clawproxy.db"
    db_dir.mkdir(parents=True)
    rig = await make_rig()
    await rig.chat(_body("spooled"), {"x-session-id": "sp2"})
    await rig.stats_when(lambda s: s["spool_records"] == 1, "the turn to be spooled")
    await rig.app.shutdown()
    await rig.app.cleanup()
    shutil.rmtree(db_dir)
    rig2 = await make_rig()  # same data dir: the spool is replayed at start
    assert (await rig2.stats())["spool_records"] == 0
    assert [t["response_text"] for t in rig2.turns()] == ["pong: spooled part1 part2 part3"]


async def test_turn_survives_sigkill(aiohttp_server, tmp_path):
    fake = FakeUpstream()
    up = await aiohttp_server(fake.app())
    data = tmp_path / "data"
    # leaving the with closes the output pipe (the proxy is reaped first, below)
    with held_port() as port, subprocess.Popen(
            [sys.executable, "-m", "clawproxy.proxy", "--upstream", str(up.make_url("")).rstrip("/"),
             "--port", str(port), "--data-dir", str(data), "--log-level", "WARNING"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    ) as proc:
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as client:
                await wait_ok(base + "/clawproxy/health", 30, proc)
                async with client.post(base + "/v1/chat/completions", json=_body("remember me"),
                                       headers={"session_id": "kill:0"}) as r:
                    assert r.status == 200
                    assert b"pong: remember me" in await r.read()

                async def recorded() -> bool:
                    async with client.get(base + "/clawproxy/stats") as r:
                        return (await r.json())["turns_recorded"] == 1

                await until(recorded, "the turn to be recorded", poll=0.05)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    st = Store(data / "clawproxy.db")
    try:
        [t] = st.query("SELECT * FROM turns")
        assert t["session_id"] == "kill" and t["response_text"].startswith("pong: remember me")
        assert oct(data.stat().st_mode & 0o777) == "0o700"
        assert oct((data / "clawproxy.db").stat().st_mode & 0o777) == "0o600"
    finally:
        st.close()


async def test_write_failure_spools_and_replays_on_next_success(rig, tmp_path):
    await rig.chat(_body("first"), {"x-session-id": "wf"})
    await rig.wait_recorded(1)
    disk_full(rig, True)
    try:
        status, _, _ = await rig.chat(_body("during failure" + BIG), {"x-session-id": "wf"})
        assert status == 200
        s = await rig.stats_when(lambda s: s["spool_records"] == 1, "the turn to be spooled")
        assert s["store_ok"] is False and "full" in s["last_error"], s
    finally:
        disk_full(rig, False)
    await rig.chat(_body("after"), {"x-session-id": "wf"})
    await rig.wait_recorded(3)
    texts = [t["response_text"].split(" part")[0].split(" filler")[0] for t in rig.turns()]
    assert sorted(texts) == ["pong: after", "pong: during failure", "pong: first"]
    assert (await rig.stats())["spool_records"] == 0


async def test_turns_spooled_during_a_failure_link_in_order(rig):
    # q1 recorded; q2 spooled while inserts fail; q3 arrives after the store recovers. q2 must be
    # replayed before q3 is written, so q2 gets q3's user message as its next state and q3 waits.
    def msgs(*qs):
        out = [{"role": "system", "content": "sys"}]
        for i, q in enumerate(qs):
            out.append({"role": "user", "content": q})
            if i < len(qs) - 1:
                out.append({"role": "assistant", "content": f"pong: {q} part1 part2 part3"})
        return {"model": "m", "stream": True, "messages": out}

    h = {"x-session-id": "order"}
    await rig.chat(msgs("q1"), h)
    await rig.wait_recorded(1)
    disk_full(rig, True)
    try:
        big = msgs("q1", "q2")
        big["messages"][0]["content"] += BIG
        await rig.chat(big, h)
        await rig.stats_when(lambda s: s["spool_records"] == 1, "the turn to be spooled")
    finally:
        disk_full(rig, False)
    await rig.chat(msgs("q1", "q2", "q3"), h)
    await rig.wait_recorded(3)
    by_q = {t["request_messages"][-1]["content"]: t for t in rig.turns()}
    assert [by_q[q]["turn_index"] for q in ("q1", "q2", "q3")] == [0, 1, 2]
    assert by_q["q1"]["next_state"] == [{"role": "user", "content": "q2"}]
    assert by_q["q2"]["next_state"] == [{"role": "user", "content": "q3"}]
    assert (by_q["q3"]["next_state"], by_q["q3"]["reason"]) == (None, "pending")


async def test_turns_still_queued_when_shutdown_times_out_are_spooled(tmp_path):
    # Another process holds the write lock: the recorder's first batch waits on it, the second
    # turn is still queued when close() gives up waiting. It goes to the spool, not nowhere.
    from clawproxy.config import load_config
    from clawproxy.proxy.recorder import Recorder
    from clawproxy.proxy.tap import Capture

    cfg = load_config(None, {"data_dir": str(tmp_path / "data"), "proxy.upstream": "http://127.0.0.1:9"})
    rec = Recorder(cfg)
    await rec.start()

    def cap(rid: str) -> Capture:
        c = Capture(rid, time.time(), "/v1/chat/completions", time.perf_counter(),
                    body={"model": "m", "messages": [{"role": "user", "content": rid}]},
                    session_headers={"x-session-id": "slow"}, http_status=200)
        c.chunks.append(b'{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},'
                        b'"finish_reason":"stop"}]}')
        c.t_end = time.perf_counter()
        return c

    blocker = Store(cfg.db_path)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        rec.submit(cap("first"))
        # Off the queue means in the worker's batch, which waits for the lock (nothing yields between).
        await until(lambda: rec.stats()["queue_depth"] == 0, "the drain task to take the first turn")
        rec.submit(cap("second"))
        closing = asyncio.create_task(rec.close(timeout=0.3), name="close")
        # Only close() can empty the queue now (the worker still waits): it gave up and took "second".
        await until(lambda: rec.stats()["queue_depth"] == 0, "close() to give up and take the queued turn")
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    await closing
    assert b'"second"' in (cfg.data_path / "spool.jsonl").read_bytes()
    rec2 = Recorder(cfg)
    await rec2.start()  # replays the spool
    await rec2.close()
    st = Store(cfg.db_path)
    try:
        assert [r["request_id"] for r in st.query("SELECT request_id FROM turns ORDER BY id")] == [
            "first", "second"]
    finally:
        st.close()
