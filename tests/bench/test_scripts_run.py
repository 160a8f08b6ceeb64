"""Every bench script starts as a script: no script may shadow a package the others import."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_"))
PACKAGES = {"clawproxy", "judge", "trainer", "tests"}


def test_no_script_takes_a_package_name():
    assert {Path(s).stem for s in SCRIPTS} & PACKAGES == set()


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_runs(script):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--help"], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
