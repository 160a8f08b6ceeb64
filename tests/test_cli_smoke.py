import subprocess
import sys

import pytest
from click.testing import CliRunner

from clawproxy.cli import main


def test_help_lists_commands():
    result = CliRunner().invoke(main, ["-h"])
    assert result.exit_code == 0, result.output
    for cmd in ("start", "sessions", "judge", "train", "rollback", "stats", "openclaw-config"):
        assert cmd in result.output


def test_proxy_path_imports_without_torch():
    code = ("import sys, clawproxy.cli, clawproxy.store, clawproxy.config, clawproxy.proxy.app; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_command_modules_do_not_import_the_root_cli():
    # clawproxy.cli attaches them; none may need it back (the old import circle)
    code = ("import sys, clawproxy.sessions_cli, judge.cli, trainer.cli; "
            "assert 'clawproxy.cli' not in sys.modules, 'a command module imports clawproxy.cli'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("args", [
    ["start"], ["sessions"], ["sessions", "export"], ["openclaw-config"], ["judge", "run"],
    ["train"], ["rollback"], ["stats"],
])
def test_a_bad_config_is_one_line_that_says_what_to_change(tmp_path, args):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  max_batch_size: 0\n")
    result = CliRunner().invoke(main, [*args, "--config", str(bad), "--data-dir", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # a ClickException, not a traceback
    assert "Error: engine.max_batch_size = 0: input should be greater than or equal to 1" in result.output
