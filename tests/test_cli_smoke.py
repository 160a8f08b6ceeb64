from click.testing import CliRunner

from clawproxy.cli import main


def test_help_lists_commands():
    result = CliRunner().invoke(main, ["-h"])
    assert result.exit_code == 0, result.output
    for cmd in ("start", "sessions", "judge", "train", "rollback", "stats", "openclaw-config"):
        assert cmd in result.output


def test_proxy_path_imports_without_torch():
    import subprocess
    import sys

    code = "import sys, clawproxy.cli, clawproxy.store, clawproxy.config; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
