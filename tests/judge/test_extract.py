import json
from pathlib import Path

from judge.extract import clean_user_text, from_turn, last_user_request, next_state_text
from tests.judge.conftest import CTX, RUNTIME, add_turn

# A copy of shared/openclaw/samples.jsonl (real OpenClaw requests; keys are fake test keys).
SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "openclaw_samples.jsonl"


def test_request_is_the_users_real_text(store):
    tid = add_turn(store, "s1", request="what's the capital of Peru?", response="Lima.",
                   next_user="thanks!")
    inp = from_turn(store.get_turn(tid))
    assert inp.request == "what's the capital of Peru?"
    assert inp.response == "Lima."
    assert inp.next_state == "thanks!"  # timestamp and CTX message stripped
    assert inp.role == "user"


def test_tool_loop_request_and_tool_next_state(store):
    calls = [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path":"a.txt"}'}}]
    tid = add_turn(store, "s1", request="read a.txt", response=None, tool_calls=calls,
                   tool_result="Error: ENOENT: no such file")
    inp = from_turn(store.get_turn(tid))
    assert inp.role == "tool"
    assert inp.next_state == "Error: ENOENT: no such file"
    assert 'read({"path":"a.txt"})' in inp.response


def test_list_content_runtime_line_and_ctx_are_peeled():
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "[Mon 2026-11-30 09:12 UTC] fix the bug\n\n" + RUNTIME}]},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "content": "ok", "tool_call_id": "x"},
        CTX,
    ]
    assert last_user_request(messages) == "fix the bug"
    assert clean_user_text("[Sun 2026-11-29 23:01 UTC] hello there\n\n" + RUNTIME) == "hello there"
    assert next_state_text([CTX, {"role": "user", "content": "[Sun 2026-11-29 23:01 UTC] no"}], "user") == "no"


def test_recorded_openclaw_requests():
    """Real OpenClaw bodies: the request is the user's text, never the internal-context message."""
    rows = [json.loads(line) for line in SAMPLES.read_text().splitlines() if line.strip()]
    by_label = {r["label"].split(" ")[0]: r for r in rows}
    msgs = by_label["main-turn-2"]["body"]["messages"]
    assert last_user_request(msgs) == "second turn please"
    msgs = by_label["tool-followup"]["body"]["messages"]
    assert last_user_request(msgs) == "TOOLTEST read the file"
