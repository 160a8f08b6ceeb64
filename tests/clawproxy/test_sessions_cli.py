"""`clawproxy sessions list|show|export|delete` on a store the proxy filled."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from clawproxy.cli import main
from tests.proxy.test_proxy_forwarding import CTX_MSG


@pytest.fixture
async def filled(rig):
    """Two sessions: one with a linked (trainable) turn and a pending one, and a heartbeat."""
    m1 = [{"role": "system", "content": "s"}, {"role": "user", "content": "what is 2+2"}, CTX_MSG]
    await rig.chat({"model": "m", "stream": True, "messages": m1}, {"session_id": "alpha:0"})
    m2 = [*m1[:2], {"role": "assistant", "content": "pong"}, {"role": "user", "content": "thanks, SECRETWORD"}, CTX_MSG]
    await rig.chat({"model": "m", "stream": True, "messages": m2}, {"session_id": "alpha:0"})
    hb = [{"role": "user", "content": "Follow the heartbeat monitor scratch context when provided."}, CTX_MSG]
    await rig.chat({"model": "m", "stream": True, "messages": hb}, {"session_id": "beta:0"})
    await rig.wait_recorded(3)
    return rig


def _run(args, data_dir, input=None):
    r = CliRunner().invoke(main, [*args, "--data-dir", str(data_dir)], input=input,
                           env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    return r.output


async def test_list_show_export(filled, tmp_path):
    d = filled.cfg.data_dir
    out = _run(["sessions"], d)
    assert "alpha" in out and "beta" in out
    rows = json.loads(_run(["sessions", "list", "--json", "-n", "5"], d))
    by = {r["id"]: r for r in rows}
    assert by["alpha"]["main_turns"] == 2 and by["alpha"]["trainable_turns"] == 1
    assert by["beta"]["side_turns"] == 1 and by["beta"]["main_turns"] == 0
    assert len(json.loads(_run(["sessions", "--json", "-n", "1"], d))) == 1
    shown = _run(["sessions", "show", "alph"], d)  # unique prefix
    assert "ok" in shown and "thanks" in shown and "pending" in shown
    data = json.loads(_run(["sessions", "show", "alpha", "--json"], d))
    assert [t["reason"] for t in data["turns"]] == ["ok", "pending"]

    out_file = tmp_path / "turns.jsonl"
    _run(["sessions", "export", "--out", str(out_file)], d)
    lines = [json.loads(x) for x in out_file.read_text().splitlines()]
    assert len(lines) == 3
    assert out_file.stat().st_mode & 0o077 == 0  # owner-only, like the store
    first = lines[0]
    for key in ("session_id", "turn", "timestamp", "messages", "prompt_text", "response_text",
                "tool_calls", "next_state", "kind", "trainable", "reason", "completion_token_ids",
                "completion_logprobs", "weight_version"):
        assert key in first, key
    assert first["session_id"] == "alpha" and first["turn"] == 0 and first["trainable"] is True
    assert first["next_state"] == [{"role": "user", "content": "thanks, SECRETWORD"}]
    assert "<|user|>\nwhat is 2+2" in first["prompt_text"]
    assert first["completion_token_ids"] and first["timestamp"].endswith("Z")
    stdout = _run(["sessions", "export", "--session", "beta"], d)
    assert [json.loads(x)["kind"] for x in stdout.splitlines()] == ["side"]


async def test_delete_removes_data_for_real(filled):
    d = filled.cfg.data_dir
    r = CliRunner().invoke(main, ["sessions", "delete", "alpha", "--data-dir", str(d)], input="n\n")
    assert r.exit_code != 0  # declined
    assert len(json.loads(_run(["sessions", "--json"], d))) == 2
    # Stop the proxy's recorder so nothing holds the database open, as after `clawproxy start` exits.
    await filled.app.shutdown()
    await filled.app.cleanup()
    _run(["sessions", "delete", "alpha", "--yes"], d)
    assert [r["id"] for r in json.loads(_run(["sessions", "--json"], d))] == ["beta"]
    for p in filled.cfg.data_path.iterdir():
        assert b"SECRETWORD" not in p.read_bytes(), p
    _run(["sessions", "delete", "--all"], d, input="y\n")
    assert json.loads(_run(["sessions", "--json"], d)) == []


HOSTILE_KEY = "[/oops] \x1b]52;c;cHduZWQ=\x07[bold]k"  # broken markup, then OSC 52 (write the clipboard)
HOSTILE_TEXT = ("\x1b]8;;https://evil.example\x1b\\here\x1b]8;;\x1b\\ [/bold] [link=https://x.example]a[/link]"
                " \x1b[2J\x9b31m \u202egnp.exe")


@pytest.mark.parametrize("tty", [False, True])
async def test_what_clients_send_is_shown_as_text(rig, tty):
    # a client chooses the session key and every word of the conversation: none of it may act on
    # the terminal (markup, hyperlinks, escape sequences), whether or not the output is a TTY
    await rig.chat({"model": "m", "prompt_cache_key": HOSTILE_KEY,
                    "messages": [{"role": "user", "content": HOSTILE_TEXT}]})
    await rig.wait_recorded(1)
    env = {"COLUMNS": "400", **({"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"} if tty else {})}
    d = str(rig.cfg.data_dir)
    outs = []
    for args in (["sessions"], ["sessions", "list"], ["sessions", "show", "[/oops]"]):
        r = CliRunner().invoke(main, [*args, "--data-dir", d], env=env)
        assert r.exit_code == 0, (args, r.output, r.exception)
        outs.append(r.output)
    listing, _, shown = outs
    assert "[/oops]" in listing and "[/bold] [link=" in shown
    for out in outs:
        assert "\x1b]" not in out and "\x07" not in out and "\x9b" not in out and "\u202e" not in out
        # a TTY gets colours (SGR: ESC [ ... m) and nothing else
        assert re.sub(r"\x1b\[[0-9;]*m", "", out).count("\x1b") == 0
    assert "\\x1b]52;c;" in shown and "\\x1b]8;;https://evil.example" in shown  # spelled out


def test_missing_store_is_a_clear_error(tmp_path):
    r = CliRunner().invoke(main, ["sessions", "--data-dir", str(tmp_path / "none")])
    assert r.exit_code != 0 and "no store" in r.output
