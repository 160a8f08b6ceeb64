"""llama.cpp's ``llama-server``, built once from a pinned source, with its conversion scripts.

The source is the llama.cpp tree that the llama-cpp-python sdist on PyPI carries
(``vendor/llama.cpp``): the registries are all this project may download from. The sdist is
checked by size and sha256 before anything in it is used, and none of its Python code runs here
except llama.cpp's own conversion scripts (``convert_hf_to_gguf.py``, ``convert_lora_to_gguf.py``),
which read safetensors and write GGUF.

    python -m clawproxy.engine.llamacpp.build        # build (or find) it; prints the server's path

Layout, under ``$CLAWPROXY_LLAMACPP_CACHE`` (default ``~/.cache/clawproxy/llama.cpp``)::

    <version>/src/                         the extracted llama.cpp tree
    <version>/src/build/bin/llama-server   the server, statically linked to ggml and llama
    <version>/built                        stamp: the build finished, with these flags

The build is native (``GGML_NATIVE``): a cache belongs to the machine that built it.
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from clawproxy.errors import ConfigError

SDIST = "llama-cpp-python==0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SIZE = 76589250
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VERSION = "0.3.36"  # llama.cpp as vendored by that sdist (commit 0c1e570)
# AMX tiles stay off: on an AMX CPU in a VM that does not grant them, loading 4-bit weights into
# ggml's AMX buffers crashes llama-server (SIGSEGV, bench/results/i51); the AVX-512 kernels remain.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
CMAKE_FLAGS = ("-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=ON",
               "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}")
STAMP = f"{VERSION} {' '.join(CMAKE_FLAGS)}\n"  # a build with other flags is built again


@dataclass(frozen=True)
class LlamaCpp:
    """A built llama.cpp: the server and the scripts that make its GGUF files."""

    root: Path  # the source tree

    @property
    def server(self) -> Path:
        return self.root / "build" / "bin" / "llama-server"

    @property
    def convert_model(self) -> Path:
        return self.root / "convert_hf_to_gguf.py"

    @property
    def convert_lora(self) -> Path:
        return self.root / "convert_lora_to_gguf.py"

    def script_env(self) -> dict[str, str]:
        """The environment the conversion scripts need: llama.cpp's own ``gguf`` package first."""
        path = os.pathsep.join([str(self.root / "gguf-py"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return {**os.environ, "PYTHONPATH": path, "NO_LOCAL_GGUF": ""}


def cache_dir() -> Path:
    env = os.environ.get("CLAWPROXY_LLAMACPP_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "clawproxy" / "llama.cpp"


def find(cache: Path | None = None) -> LlamaCpp | None:
    """The built llama.cpp in the cache, or None."""
    base = (cache or cache_dir()) / VERSION
    found = LlamaCpp(base / "src")
    stamp = base / "built"
    return found if stamp.exists() and stamp.read_text() == STAMP and found.server.exists() else None


def require(cache: Path | None = None) -> LlamaCpp:
    """The built llama.cpp, or a ConfigError that says how to build it."""
    found = find(cache)
    if found is None:
        raise ConfigError("engine.kind is llamacpp but llama-server is not built; `clawproxy start` builds it "
                          "(or `make llamacpp`, `python -m clawproxy.engine.llamacpp.build`), 5-12 minutes on 2 cores.")
    return found


def _check_sdist(path: Path) -> None:
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if size != SDIST_SIZE or digest.hexdigest() != SDIST_SHA256:
        raise ConfigError(f"{path.name}: size {size}, sha256 {digest.hexdigest()}; expected {SDIST_SIZE}, "
                          f"{SDIST_SHA256}. The download is not the pinned source; delete it and retry.")


def _download(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), SDIST]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    path = dest / SDIST_FILE
    if proc.returncode != 0 and not path.exists():
        tail = " ".join((proc.stderr or proc.stdout).split())[-400:]
        raise ConfigError(f"downloading {SDIST} failed: {tail}; check the network or pip's index settings")
    return path


def _extract(sdist: Path, out: Path) -> None:
    prefix = f"{SDIST_FILE.removesuffix('.tar.gz')}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if m.name.startswith(prefix) and (m.isfile() or m.isdir()):
                m.name = m.name[len(prefix):]
                members.append(m)
        tar.extractall(out, members=members, filter="data")


# A streamed token that ends inside a UTF-8 character is never sent (its id and log-prob are lost);
# the recorder needs every sampled id, so such a token goes out with empty text.
PATCHES = (
    ("tools/server/server-context.cpp",
     "        if (incomplete) {\n            slot.has_next_token = true;\n        }\n",
     "        if (incomplete) {\n            slot.has_next_token = true;\n"
     "            if (slot.task->params.stream) {  // clawproxy: the token's id and log-prob, no text yet\n"
     "                result.text_to_send = \"\";\n"
     "                send_partial_response(slot, result, false);\n"
     "            }\n        }\n"),
)


def patch(src: Path) -> None:
    """Apply ``PATCHES`` once; an anchor that is not found means the pinned source changed."""
    for rel, old, new in PATCHES:
        path = src / rel
        text = path.read_text()
        if new in text:
            continue
        if text.count(old) != 1:
            raise ConfigError(f"{rel}: the patch anchor is not in the source; is {SDIST} the one extracted?")
        path.write_text(text.replace(old, new))


NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
NEEDS = "cmake, ninja and a C++17 compiler (Debian/Ubuntu: apt-get install cmake ninja-build g++; macOS: " \
        "xcode-select --install && brew install cmake ninja)"


def build(cache: Path | None = None, jobs: int | None = None, echo: bool = True,
          progress: Callable[[int, int], None] | None = None, log_path: Path | None = None) -> LlamaCpp:
    """Download, check, extract and build llama-server once (later calls find it built).

    ``progress(done, total)`` gets ninja's ``[N/M]`` steps; ``log_path`` gets the build's output
    (with ``echo`` it also goes to stdout). A failed step raises a ConfigError with the output's
    last lines and what to install."""
    base = (cache or cache_dir()) / VERSION
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (found := find(cache)) is not None:
            return found
        missing = [tool for tool in ("cmake", "ninja", "c++") if shutil.which(tool) is None]
        if missing:
            raise ConfigError(f"building llama-server needs {', '.join(missing)} on PATH; install {NEEDS}")
        src = base / "src"
        if not (src / "CMakeLists.txt").exists():
            with tempfile.TemporaryDirectory(dir=base) as tmp:
                sdist = _download(Path(tmp))
                _check_sdist(sdist)
                shutil.rmtree(src, ignore_errors=True)
                _extract(sdist, src)
        patch(src)
        steps = [["cmake", "-S", str(src), "-B", str(src / "build"), *CMAKE_FLAGS],
                 ["cmake", "--build", str(src / "build"), "--target", "llama-server",
                  "-j", str(jobs or os.cpu_count() or 2)]]
        log = open(log_path, "a") if log_path is not None else None  # noqa: SIM115 (closed below)
        try:
            for step in steps:
                _run_step(step, echo, progress, log, log_path)
        finally:
            if log is not None:
                log.close()
        (base / "built").write_text(STAMP)
        return LlamaCpp(src)


def _run_step(step: list[str], echo: bool, progress: Callable[[int, int], None] | None, log: TextIO | None,
              log_path: Path | None) -> None:
    proc = subprocess.Popen(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    tail: collections.deque[str] = collections.deque(maxlen=12)
    for line in proc.stdout:
        tail.append(line.rstrip())
        if echo:
            print(line, end="", flush=True)
        if log is not None:
            log.write(line)
        if progress is not None and (m := NINJA_STEP.match(line)):
            progress(int(m.group(1)), int(m.group(2)))
    if proc.wait() != 0:
        where = f"; the whole output: {log_path}" if log_path is not None else ""
        lines = "\n".join(tail)
        raise ConfigError(f"building llama-server failed at `{' '.join(step[:2])}`:\n{lines}\nIt needs {NEEDS}{where}. "
                          "Or serve with another engine: --engine vllm or --engine embedded.")


def main() -> int:
    try:
        print(build().server)
    except ConfigError as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
