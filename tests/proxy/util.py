"""What the proxy's reliability tests share: waiting for the recorder to go idle, holding its worker."""

from __future__ import annotations

import threading

from clawproxy.proxy.app import RECORDER_KEY


async def wait_idle(rig, n_turns: int, n_quarantined: int = 0, timeout: float = 10.0) -> dict:
    def idle(s: dict) -> bool:  # both counts move once the turn is committed: nothing left to settle
        return s["turns_recorded"] >= n_turns and s["quarantined"] >= n_quarantined and s["queue_depth"] == 0

    return await rig.stats_when(idle, f"{n_turns} turns recorded, {n_quarantined} quarantined", timeout)


def hold_recorder(rig, monkeypatch):
    """Stop the recorder's worker until the returned event is set (the journal keeps the turns)."""
    rec = rig.app[RECORDER_KEY]
    gate = threading.Event()
    orig = rec._process

    def held(batch):
        gate.wait(20)
        return orig(batch)

    monkeypatch.setattr(rec, "_process", held)
    return rec, gate
