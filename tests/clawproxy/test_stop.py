"""A child's poll loop exits on SIGTERM whenever it lands: the handler takes no lock.

The child runs the judge worker's real poll loop (``Worker.run``, follow, over a store with no
turns, the poll interval 0 so that the loop spends its time in the stop's ``wait``) many times; the
parent sends SIGTERM at a random moment of each run and waits for the next to begin. With the handler judge/cli.py had (``threading.Event.set()``), some signal lands while
the main thread holds the event's lock inside ``Event.wait`` and the child hangs for good; the
second test keeps that handler to prove the first can fail.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from clawproxy.stop import Stop, on_signals

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import contextlib, signal, sys, threading
from judge.worker import Worker
from clawproxy.stop import on_signals

class NoTurns:
    def unjudged_turns(self, n, exclude):
        return []

def event_handler():  # judge/cli.py before issue 50
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return contextlib.nullcontext(stop)

make = {"stop": lambda: on_signals(signal.SIGTERM), "event": event_handler}[sys.argv[1]]
for i in range(int(sys.argv[2])):
    with make() as stop:
        print(i, flush=True)
        Worker(NoTurns(), None).run(True, 0.0, stop)
"""


def _signal_rounds(handler: str, rounds: int, hang_s: float = 5.0) -> int:
    """Rounds that ended on their SIGTERM before the child stopped answering (``rounds``: all)."""
    rng = random.Random(50)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, handler, str(rounds)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        for i in range(rounds):
            line = _readline(proc, hang_s)
            if line is None:
                return i
            assert line.strip() == str(i)
            time.sleep(rng.uniform(0, 0.003))  # a random moment of the poll loop, not a synchronisation
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=hang_s)
        return rounds
    except subprocess.TimeoutExpired:
        return rounds - 1
    finally:
        proc.kill()
        proc.wait()


def _readline(proc: subprocess.Popen, timeout: float) -> str | None:
    """The child's next line, or None if it says nothing for ``timeout`` s (it hangs)."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            return None
    return proc.stdout.readline()


def test_sigterm_at_random_moments_always_ends_the_poll_loop():
    assert _signal_rounds("stop", 400) == 400


def test_the_event_handler_judge_had_hangs_under_the_same_signals():
    """The check above can fail: ``Event.set()`` in the handler deadlocks within these rounds."""
    assert _signal_rounds("event", 400) < 400


def test_stop_wakes_a_waiter_and_stays_set():
    stop = Stop()
    t0 = time.monotonic()
    assert stop.wait(0.01) is False and time.monotonic() - t0 >= 0.01
    stop.set()
    stop.set()  # twice: still one state
    assert stop.is_set() and stop.wait(60) is True
    stop.close()


def test_on_signals_restores_the_previous_handlers():
    before = signal.getsignal(signal.SIGTERM)
    with on_signals(signal.SIGTERM) as stop:
        assert signal.getsignal(signal.SIGTERM) is not before
        signal.raise_signal(signal.SIGTERM)
        assert stop.is_set()
    assert signal.getsignal(signal.SIGTERM) is before


UNWIND_CHILD = r"""
import asyncio, contextlib, sys
from clawproxy.stop import terminate_unwinds

async def serve():
    print("running", flush=True)
    await asyncio.sleep(60)

wrap = terminate_unwinds() if sys.argv[1] == "unwinds" else contextlib.nullcontext()
try:
    with wrap:
        asyncio.run(serve())
finally:
    print("stopped the system", flush=True)
"""


def _terminated(mode: str) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-c", UNWIND_CHILD, mode], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert _readline(proc, 30) == "running\n"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        return proc.returncode, out
    finally:
        proc.kill()
        proc.wait()


def test_sigterm_unwinds_a_command_so_it_stops_what_it_started():
    # clawproxy simulate's finally stops the `clawproxy start` it launched
    assert _terminated("unwinds") == (143, "stopped the system\n")
    # by default SIGTERM ends Python at once and no finally runs: the check above can fail
    assert _terminated("default") == (-signal.SIGTERM, "")
