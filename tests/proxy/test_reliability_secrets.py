"""Issue 15's and issue 25's reproducers, secrets: redacted before anything is written (the store,
the spool, the journal, the log file, an export), by position and by structure, unless turned off.
Each test failed before its fix."""

from __future__ import annotations

import json
import logging
import time

import orjson

from clawproxy.store import Store
from tests.proxy.test_durability import disk_full
from tests.proxy.test_proxy_forwarding import _body
from tests.proxy.util import hold_recorder, wait_idle

# -- 2: secrets are redacted before they are written ----------------------------------------------
SECRETS = ["sk-proj-AbCdEfGhIjKlMnOpQrStUv0123", "ghp_0123456789abcdefghijABCDEFGHIJ",
           "hf_abcdefghijklmnopqrstuvwxyz0123", "AKIAABCDEFGHIJKLMNOP", "tok.en-value_1234567890"]
PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"


async def test_secrets_in_every_position_are_redacted(make_rig, caplog):
    caplog.set_level(logging.INFO)
    rig = await make_rig()
    s0, s1, s2, s3, s4 = SECRETS
    body = _body(f"{s0} rest")  # the fake answers "pong: <first 40 chars>": the response has it too
    body.update(api_key="plain-password-like-value", metadata={"k": s1, "nested": [{"password": "hunter22"}]})
    body["messages"].insert(1, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": orjson.dumps({"key": s2, "pem": PEM}).decode()}}]})
    body["messages"].insert(2, {"role": "tool", "tool_call_id": "c", "content": f"Authorization: Bearer {s4} {s3}"})
    status, _, _ = await rig.chat(body, {"Authorization": f"Bearer {s4}", "session_id": "sec"})
    assert status == 200
    # while the store is down, the spool must not get them either
    disk_full(rig, True)
    body2 = _body(f"{s0} again" + " filler" * 4000)
    await rig.chat(body2, {"session_id": "sec"})
    await rig.stats_when(lambda s: s["spool_records"] > 0, "the turn to be spooled")
    spool = (rig.cfg.data_path / "spool.jsonl").read_bytes()
    disk_full(rig, False)
    await rig.chat(_body("ok"), {"session_id": "sec"})
    await wait_idle(rig, 3)
    t = rig.turns()[0]
    assert t["request_params"]["api_key"] == "[REDACTED]"
    assert t["prompt_token_ids"] is None and t["completion_token_ids"] is None  # they spell it too
    assert rig.turns()[-1]["completion_token_ids"]  # a turn without secrets keeps its ids
    assert "[REDACTED]" in t["response_text"]
    for secret in [*SECRETS, "plain-password-like-value", "hunter22", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"]:
        assert secret.encode() not in spool
        for p in rig.cfg.data_path.rglob("*"):
            if p.is_file():
                assert secret.encode() not in p.read_bytes(), (secret, p)
        assert secret not in caplog.text


async def test_redaction_can_be_turned_off(make_rig):
    rig = await make_rig(**{"proxy.redact_secrets": False})
    await rig.chat(_body(SECRETS[0]))
    await wait_idle(rig, 1)
    assert SECRETS[0] in rig.turns()[0]["request_messages"][1]["content"]


# -- the log file: private, rotated, redacted ------------------------------------------------------
def test_log_file_is_private_rotated_and_redacted(tmp_path, monkeypatch):
    from clawproxy import supervisor
    from clawproxy.config import load_config

    monkeypatch.setattr(supervisor, "LOG_MAX_BYTES", 4000)
    cfg = load_config(None, {"data_dir": str(tmp_path / "data")})
    root = logging.getLogger()
    before = list(root.handlers)
    monkeypatch.setattr(root, "handlers", [h for h in before if not getattr(h, "_clawproxy", False)])
    try:
        supervisor._setup_logging(cfg)
        for i in range(100):
            logging.getLogger("clawproxy.test").warning("line %d with %s", i, SECRETS[0])
    finally:
        for h in [h for h in root.handlers if getattr(h, "_clawproxy", False)]:
            h.close()
    logs = sorted((tmp_path / "data" / "logs").iterdir())
    assert [p.name for p in logs][:2] == ["clawproxy.log", "clawproxy.log.1"]
    for p in logs:
        assert oct(p.stat().st_mode & 0o777) == "0o600", p
        assert SECRETS[0].encode() not in p.read_bytes() and b"[REDACTED]" in p.read_bytes()


# -- issue 25: redaction by structure, and no secret in the journal -------------------------------
async def test_every_secret_shape_is_redacted_everywhere_and_counts_stay(make_rig, monkeypatch, caplog):
    import random

    from tests.rig.secret_shapes import CLEAN, shapes

    caplog.set_level(logging.DEBUG)
    rig = await make_rig()
    rec, gate = hold_recorder(rig, monkeypatch)
    cases = shapes(random.Random(25))
    assert len(cases) >= 40
    for label, _, body in cases:
        status, _, _ = await rig.chat(body, {"x-session-id": label})
        assert status == 200, label
    await rig.chat(CLEAN, {"x-session-id": "clean"})
    journal = rec.journal_path.read_bytes()  # every turn is journaled, none stored yet
    assert journal.count(b"CJ1 ") == len(cases) + 1
    gate.set()
    await wait_idle(rig, len(cases) + 1)
    from click.testing import CliRunner

    from clawproxy.cli import main

    export = CliRunner().invoke(main, ["sessions", "export", "--data-dir", str(rig.cfg.data_dir)]).output
    files = {p.name: p.read_bytes() for p in rig.cfg.data_path.rglob("*") if p.is_file()}
    leaks = [(label, where) for label, secret, _ in cases
             for where, data in [("journal", journal), ("export", export.encode()),
                                 ("log", caplog.text.encode()), *files.items()]
             if secret.encode() in data]
    assert leaks == []
    turns = {t["session_id"]: t for t in rig.turns()}
    assert len(turns) == len(cases) + 1
    assert turns["member_password_number"]["request_params"]["metadata"] == {"password": "[REDACTED]"}
    assert turns["member_auth_token"]["request_params"]["metadata"] == {"auth": "[REDACTED]"}
    args = json.loads(turns["tool_args_password"]["request_messages"][2]["tool_calls"][0]["function"]["arguments"])
    assert args == {"config": {"password": "[REDACTED]", "retries": 3}}
    # what only looks like a secret stays, and so do the token counts and ids the trainer needs
    clean = turns["clean"]
    assert clean["request_messages"] == CLEAN["messages"]
    assert clean["request_params"]["max_tokens"] == 77
    assert clean["completion_token_ids"] and clean["prompt_token_ids"] and clean["completion_logprobs"]
    assert clean["usage"]["prompt_tokens"] and clean["usage"]["completion_tokens"]
    assert all(t["completion_token_ids"] is None for sid, t in turns.items() if sid != "clean")


async def test_a_killed_proxys_journal_replays_a_redacted_turn_without_its_token_ids(tmp_path):
    from clawproxy.config import load_config
    from clawproxy.proxy.journal import journal_entry
    from clawproxy.proxy.recorder import Recorder
    from clawproxy.proxy.redact import Redactor
    from clawproxy.proxy.tap import Capture

    cfg = load_config(None, {"data_dir": str(tmp_path / "data"), "proxy.upstream": "http://127.0.0.1:9"})
    cfg.data_path.mkdir(parents=True)
    body = _body("hi", metadata={"db_password": "Zx81hunter2"})
    c = Capture("r1", time.time(), "/v1/chat/completions", 0.0, stream=True, done=True,
                raw_body=orjson.dumps(body), body=body, http_status=200, t_end=0.1)
    c.chunks.append(b'data: {"choices":[{"index":0,"delta":{"content":"sk-live0123456789abcdefXYZ"},'
                    b'"finish_reason":"stop"}],"token_ids":[5,6]}\n\ndata: [DONE]\n\n')
    entry = journal_entry(c, Redactor())
    assert b"Zx81hunter2" not in entry and b"sk-live0123456789abcdefXYZ" not in entry
    (cfg.data_path / "journal.bin").write_bytes(entry)
    rec = Recorder(cfg)
    await rec.start()
    await rec.close()
    s = Store(cfg.db_path)
    try:
        [t] = s.query("SELECT * FROM turns")
    finally:
        s.close()
    assert (t["response_text"], t["completion_token_ids"]) == ("[REDACTED]", None)
