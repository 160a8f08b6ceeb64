"""Trainer tests run tiny models on a CPU shared with other test processes: one torch thread
avoids oversubscription (two threads on a busy 2-core machine were ~10x slower than one)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
