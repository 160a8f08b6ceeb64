"""docs/config.md is what clawproxy/config_reference.py renders from the config fields, now."""

from __future__ import annotations

import dataclasses

from clawproxy.config import SessionConfig
from clawproxy.config_reference import REFERENCE, render, section


def test_the_config_reference_is_current():
    assert REFERENCE.read_text() == render(), (
        "docs/config.md is stale: run `.venv/bin/python -m clawproxy.config_reference`")


def test_a_changed_help_text_changes_the_reference():
    @dataclasses.dataclass
    class Changed(SessionConfig):
        idle_timeout_s: float = dataclasses.field(default=60.0, metadata={"description": "Changed.", "gt": 0})

    rows = section(Changed, "sessions.", {"idle_timeout_s": 1800})
    assert "| `sessions.idle_timeout_s` | float | `60.0`; `configs/default.yaml`: `1800` | Changed. (> 0) |" in rows
    assert not any(row in REFERENCE.read_text() for row in rows[2:3])
