"""Users talking while the trainer trains and swaps weights (test helper): a publish must fail none."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def train_while_users_talk(trainer: Any, send: Callable[[], tuple[int | None, str]],
                           pause: float = 0.0) -> tuple[Any, list[str]]:
    """One ``trainer.run(steps=1)`` while a thread sends ``send()`` in a loop, ``pause`` s apart;
    returns the step's result and every request that did not answer 200."""
    failures: list[str] = []
    done = threading.Event()

    def traffic() -> None:
        while not done.wait(pause):
            try:
                status, text = send()
            except OSError as e:  # refused or reset: a failure too, not the end of the thread
                status, text = None, str(e)
            if status != 200:
                failures.append(f"{status} {text[:200]}")

    talker = threading.Thread(target=traffic, name="user-traffic")
    talker.start()
    try:
        (result,) = trainer.run(steps=1)
    finally:
        done.set()
        talker.join(120)
    return result, failures
