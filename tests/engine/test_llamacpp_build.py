"""Building llama-server: ninja's steps as progress, and a failed build that says what to install.
Nothing is compiled here: the steps are small scripts that print what ninja prints."""

from __future__ import annotations

import sys

import pytest

from clawproxy.engine.llamacpp import build as llamacpp_build
from clawproxy.errors import ConfigError


def _script(*lines: str, code: int = 0) -> list[str]:
    return [sys.executable, "-c", f"import sys; print({chr(10).join(lines)!r}); sys.exit({code})"]


def test_ninja_steps_become_progress_and_go_to_the_log(tmp_path):
    seen: list[tuple[int, int]] = []
    log = tmp_path / "build.log"
    with open(log, "w") as f:
        llamacpp_build._run_step(_script("[1/3] Building C object a.o", "warning: x", "[2/3] Building b.o",
                                         "[3/3] Linking llama-server"), False, lambda d, t: seen.append((d, t)),
                                 f, log)
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert "warning: x" in log.read_text() and "Linking llama-server" in log.read_text()


def test_a_failed_step_shows_its_last_lines_and_what_to_install(tmp_path):
    log = tmp_path / "build.log"
    with pytest.raises(ConfigError) as err, open(log, "w") as f:
        llamacpp_build._run_step(_script("[7/90] Building ggml.c", "fatal error: immintrin.h: No such file",
                                         code=1), False, None, f, log)
    msg = err.value.message
    assert "immintrin.h" in msg and "apt-get install cmake ninja-build g++" in msg and str(log) in msg
    assert "--engine vllm" in msg


def test_missing_build_tools_are_named_before_anything_is_downloaded(tmp_path, monkeypatch):
    monkeypatch.setattr(llamacpp_build.shutil, "which", lambda tool: None if tool == "ninja" else f"/usr/bin/{tool}")
    monkeypatch.setattr(llamacpp_build, "_download", lambda dest: pytest.fail("downloaded"))
    with pytest.raises(ConfigError, match=r"needs ninja on PATH; install .*apt-get install cmake ninja-build g\+\+"):
        llamacpp_build.build(tmp_path)
