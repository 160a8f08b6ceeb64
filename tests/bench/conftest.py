"""The bench scripts train tiny models: one torch thread, as for the trainer tests."""

from tests.trainer.conftest import _one_torch_thread  # noqa: F401 (autouse fixture)
