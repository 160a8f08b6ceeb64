"""``setting()``: how every config dataclass declares a field (clawproxy, judge and trainer alike).

A field is a plain dataclass field whose metadata holds its help text and pydantic's range rules
(``ge``, ``gt``, ``le``, ``min_length`` ...); choices are ``Literal`` types. ``clawproxy.config``
validates the YAML file and the flags against them at one edge; inside, the dataclasses stay plain.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, Literal

from pydantic import ConfigDict

STRICT = ConfigDict(extra="forbid")  # on every config dataclass: an unknown key is a typo, not a no-op
Dtype = Literal["float32", "bfloat16", "float16"]


def setting(default: Any, help: str, **rules: Any) -> Any:
    """A config field: its default, its help text and pydantic's range rules (``ge=1`` ...)."""
    meta = {"description": help, **rules}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)
