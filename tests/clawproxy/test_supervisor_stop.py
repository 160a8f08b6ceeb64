"""The supervisor's stop: SIGTERM, then after the grace period SIGKILL to the child's process group."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from clawproxy import supervisor
from clawproxy.supervisor import Child
from tests.waits import until

# A child deaf to SIGTERM (as a deadlocked handler leaves it) with a grandchild that is deaf too.
DEAF = r"""
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
kid = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
open(sys.argv[1] + ".tmp", "w").write(str(kid.pid)); os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def test_a_child_that_outlives_the_grace_period_is_killed_with_its_group(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor, "STOP_GRACE_S", 0.5)
    pidfile = tmp_path / "grandchild.pid"
    child = Child("deaf", [sys.executable, "-c", DEAF, str(pidfile)], tmp_path / "deaf.log")
    child.start()
    await until(pidfile.exists, "the deaf child to start its grandchild", timeout=60)
    assert child.proc is not None
    pid, grandchild = child.proc.pid, int(pidfile.read_text())
    t0 = time.monotonic()
    await asyncio.wait_for(child.stop(), 30)
    assert time.monotonic() - t0 >= 0.5  # it was given the grace period first
    assert child.proc.returncode == -9
    await until(lambda: not _alive(grandchild), "the grandchild to die with the group")
    assert not _alive(pid) and os.getpgid(os.getpid()) != pid


async def test_the_judge_and_the_trainer_run_below_the_engine(tmp_path):
    """The workers are started niced (BACKGROUND_NICE more than the supervisor), the engine is not:
    an equal-priority trainer starves llama.cpp's decoding on a shared CPU."""
    from clawproxy.config import load_config

    cfg = load_config(None, {"data_dir": str(tmp_path)})
    engine, workers = supervisor.build_children(cfg, tmp_path / "run-config.yaml")
    assert engine is not None and engine.nice == 0
    assert {w.name: w.nice for w in workers} == {"judge": supervisor.BACKGROUND_NICE,
                                                 "trainer": supervisor.BACKGROUND_NICE}
    ours = os.nice(0)
    for nice in (0, supervisor.BACKGROUND_NICE):
        out = tmp_path / f"nice-{nice}"
        child = Child("n", [sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write("
                            "str(os.nice(0))); time.sleep(600)", str(out)], tmp_path / "n.log", nice=nice)
        child.start()
        await until(lambda out=out: out.exists() and out.read_text() != "", "the child to write its niceness",
                    timeout=60)
        await child.stop()
        assert int(out.read_text()) == min(19, ours + nice)
