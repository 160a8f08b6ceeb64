"""What each engine can do: the rest of clawproxy asks these, never which engine it is.

``engine.kind`` names an engine in the config; ``EngineConfig.spec`` and ``EngineClient.spec``
turn that name into an ``EngineSpec``, and callers outside ``clawproxy/engine/`` branch on its
fields alone (``tests/test_import_rules.py`` counts ``engine.kind`` comparisons there: none).
So the embedded engine lives behind this interface: removing it means removing its entry here
and the modules that serve it, and no caller changes.

No imports beyond the standard library: the config, the proxy and the CLI read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EngineKind = Literal["vllm", "embedded", "llamacpp"]


@dataclass(frozen=True)
class EngineSpec:
    kind: EngineKind
    # each LoRA adapter is served under its own model name beside the base (vLLM, llama.cpp), so every
    # user's adapter can be served at once; False: one adapter merged into the one served model
    adapters_by_name: bool
    # GET /weight_info always says which version serves; False: a server may not (vLLM 0.32), so the
    # client holds the version and starts from the store's published one
    reports_weight_version: bool
    # the engine.quantization values it serves besides "none"
    quantizations: tuple[str, ...]
    # its control plane (version, dev-mode routes, runtime LoRA) is checked before the trainer uses it
    checks_control_plane: bool
    # a chat template that ignores tools still gets them, as Hermes text (clawproxy/chat_template.py);
    # False: the template gets messages and tools as they are (vLLM)
    tools_as_text: bool
    # its control routes are vLLM's (dev mode); False: clawproxy's engine server's (engine/server.py)
    vllm_routes: bool
    # built from source on the first `clawproxy start` (llama-server), with its progress in the terminal
    built_on_first_start: bool = False


SPECS: dict[str, EngineSpec] = {
    "vllm": EngineSpec("vllm", adapters_by_name=True, reports_weight_version=False, quantizations=("w4a16",),
                       checks_control_plane=True, tools_as_text=False, vllm_routes=True),
    "embedded": EngineSpec("embedded", adapters_by_name=False, reports_weight_version=True, quantizations=(),
                           checks_control_plane=False, tools_as_text=True, vllm_routes=False),
    # clawproxy's engine server over llama.cpp's llama-server (clawproxy/engine/llamacpp/engine.py)
    "llamacpp": EngineSpec("llamacpp", adapters_by_name=True, reports_weight_version=True,
                           quantizations=("q4_k_m",), checks_control_plane=False, tools_as_text=True,
                           vllm_routes=False, built_on_first_start=True),
}
KINDS: tuple[str, ...] = tuple(SPECS)


def engine_spec(kind: str) -> EngineSpec:
    """The spec of the engine named ``kind`` (``engine.kind``); ValueError names the choices."""
    try:
        return SPECS[kind]
    except KeyError:
        raise ValueError(f"engine kind {kind!r}: use one of {', '.join(KINDS)}") from None
