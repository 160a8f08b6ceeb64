"""``docs/config.md``, the configuration reference, rendered from the config dataclasses: every
field's key, type, default (and the value ``configs/default.yaml`` gives it) and help text.

``python -m clawproxy.config_reference`` rewrites the file; ``tests/clawproxy/test_config_reference.py``
fails while it differs from what this renders, so the reference cannot drift from the fields.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from clawproxy.config import DEFAULT_CONFIG, Config

REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "config.md"
RULES = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "length >=", "max_length": "length <="}


def type_text(t: Any) -> str:
    """A field's type as a reader writes its value in YAML."""
    origin = typing.get_origin(t)
    if origin is typing.Annotated:
        return type_text(typing.get_args(t)[0])
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(t))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(type_text(a) for a in typing.get_args(t))
    if origin in (list, tuple):
        return f"list of {type_text(typing.get_args(t)[0])}" if typing.get_args(t) else "list"
    if origin is dict or t is dict:
        return "mapping"
    if t is type(None):
        return "null"
    return getattr(t, "__name__", str(t))


def value_text(v: Any) -> str:
    return "`null`" if v is None else f"`{yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}`"


def section(cls: type, prefix: str, shipped: dict[str, Any]) -> list[str]:
    hints = typing.get_type_hints(cls, include_extras=True)
    rows = ["| key | type | default | help |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"{cls.__name__}.{f.name} has no default: every setting() has one")
        shown = value_text(default)
        if f.name in shipped and shipped[f.name] != default:
            shown += f"; `configs/default.yaml`: {value_text(shipped[f.name])}"
        rules = ", ".join(f"{RULES[k]} {v}" for k, v in f.metadata.items() if k in RULES)
        help_ = f.metadata.get("description", "") + (f" ({rules})" if rules else "")
        rows.append(f"| `{prefix}{f.name}` | {type_text(hints[f.name])} | {shown} | "
                    f"{help_.replace('|', chr(92) + '|')} |")
    return rows


def render() -> str:
    shipped = yaml.safe_load(DEFAULT_CONFIG.read_text()) or {}
    out = [
        "# Configuration reference",
        "",
        "Generated from the config dataclasses by `python -m clawproxy.config_reference`; do not edit by",
        "hand (`tests/clawproxy/test_config_reference.py` fails when this file is stale). Keys go in a",
        "YAML file (`clawproxy start --config FILE`) under their section; `configs/default.yaml` is the",
        "file `clawproxy start` loads when given none, and its values are shown beside the defaults.",
        "",
        "## top level",
        "",
        *section(Config, "", shipped),
    ]
    hints = typing.get_type_hints(Config)
    for f in dataclasses.fields(Config):
        if dataclasses.is_dataclass(hints[f.name]):
            out += ["", f"## {f.name}", "", *section(hints[f.name], f"{f.name}.", shipped.get(f.name) or {})]
    return "\n".join(out) + "\n"


def main() -> None:
    REFERENCE.write_text(render())
    print(f"wrote {REFERENCE}", file=sys.stderr)


if __name__ == "__main__":
    main()
