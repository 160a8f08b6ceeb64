"""Batch building: what is selected, what is skipped and why, and the OPD teacher's prompt."""

from __future__ import annotations

import random

import pytest

from clawproxy.degenerate import canary_broken, ids_loop
from clawproxy.openclaw import CTX_MARKER
from clawproxy.store import Store
from tests.trainer.util import insert_turn
from trainer.batch import (
    add_hint,
    prompt_ids,
    select_samples,
    student_prompt_ids,
    teacher_prompt_ids,
)
from trainer.config import TrainerConfig


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "clawproxy.db")
    yield s
    s.close()


def _ids(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 5000) for _ in range(n)]


def test_staleness_filter_drops_old_versions(store):
    old = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8, 1), weight_version=5)
    edge = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8, 2), weight_version=6)
    new = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8, 3), weight_version=10)
    sel = select_samples(store, TrainerConfig(max_staleness=4), current_version=10, tools_as_text=False)
    assert [s.turn_id for s in sel.samples] == [edge, new]
    assert sel.skipped == {old: "stale"}


def test_score_zero_never_fills_a_slot(store):
    zero = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8, 1), score=0)
    zero_hint = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8, 2), score=0, hint="Be brief.")
    plus = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8, 3), score=1)
    minus = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8, 4), score=-1)

    rl = select_samples(store, TrainerConfig(method="rl"), 0, tools_as_text=False)
    assert [s.turn_id for s in rl.samples] == [plus, minus]
    assert rl.skipped == {zero: "score_0", zero_hint: "score_0"}

    # OPD: the hint is what matters; combined: a score or a hint.
    opd = select_samples(store, TrainerConfig(method="opd"), 0, tools_as_text=False)
    assert [s.turn_id for s in opd.samples] == [zero_hint]
    assert opd.skipped[plus] == "no_hint"
    comb = select_samples(store, TrainerConfig(method="combined"), 0, tools_as_text=False)
    assert [s.turn_id for s in comb.samples] == [zero_hint, plus, minus]
    assert comb.skipped == {zero: "score_0"}


def test_reasons_for_bad_records_and_they_are_counted_once(store):
    missing = insert_turn(store, prompt_ids=None, completion_ids=_ids(8))
    mismatch = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8), logps=[-1.0] * 3)
    empty = insert_turn(store, prompt_ids=_ids(5), completion_ids=[])
    trunc = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8), finish_reason="length")
    loop = insert_turn(store, prompt_ids=_ids(5), completion_ids=[42, 43] * 20)
    long = insert_turn(store, prompt_ids=_ids(60), completion_ids=_ids(50, 1))
    unjudged = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8), score=None)
    side = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8), trainable=0, turn_type="side")
    good = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8, 9))

    sel = select_samples(store, TrainerConfig(max_seq_len=100), 0, tools_as_text=False)
    assert [s.turn_id for s in sel.samples] == [good]
    assert sel.skipped == {
        missing: "missing_token_ids",
        mismatch: "missing_token_ids",
        empty: "empty",
        trunc: "truncated",
        loop: "degenerate",
        long: "too_long",
    }
    assert unjudged not in sel.skipped and side not in sel.skipped
    store.record_skipped(sel.skipped)
    again = select_samples(store, TrainerConfig(max_seq_len=100), 0, tools_as_text=False)
    assert again.skipped == {} and [s.turn_id for s in again.samples] == [good]
    sample = again.samples[0]
    assert sample.behaviour_logps == [-1.0] * 8 and sample.score == 1


def test_a_cut_off_answer_trains_by_distillation_only_when_it_has_a_hint(store):
    """A cut-off answer never gets an RL term: with a hint it is a distillation-only sample (objective
    ``opd``), without one it is skipped ``truncated``, whatever the judge said; method rl skips all."""
    hinted = {score: insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8), finish_reason="length",
                                 score=score, hint="Too long.")
              for score in (-1, 0)}
    bare = {score: insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8), finish_reason="length",
                               score=score) for score in (-1, 0, 1)}
    finished = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8), score=-1, hint="Too long.")
    plain = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8), score=1)
    zero_hint = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8), score=0, hint="Shorter.")

    sel = select_samples(store, TrainerConfig(), 0, tools_as_text=False)
    assert {s.turn_id: s.objective for s in sel.samples} == {
        hinted[-1]: "opd", hinted[0]: "opd", finished: "rl_opd", plain: "rl", zero_hint: "opd"}
    assert sel.skipped == {t: "truncated" for t in bare.values()}

    rl = select_samples(store, TrainerConfig(method="rl"), 0, tools_as_text=False)
    assert {s.turn_id: s.objective for s in rl.samples} == {finished: "rl", plain: "rl"}
    assert {rl.skipped[t] for t in (*hinted.values(), *bare.values())} == {"truncated"}

    opd = select_samples(store, TrainerConfig(method="opd"), 0, tools_as_text=False)
    assert {s.objective for s in opd.samples} == {"opd"} and hinted[-1] in {s.turn_id for s in opd.samples}


def test_trained_samples_are_not_selected_again(store):
    t = insert_turn(store, prompt_ids=_ids(5), completion_ids=_ids(8))
    step = store.insert("train_steps", {"created_at": 0.0, "method": "rl", "status": "published"})
    store.insert("trained_samples", {"turn_id": t, "step_id": step})
    assert select_samples(store, TrainerConfig(), 0, tools_as_text=False).samples == []


def test_repetition_detector(default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    prose = tok.encode(
        "The sea was calm that morning. Fishing boats left the harbour one by one, and the gulls "
        "followed them out past the breakwater, where the water turned from green to a deep blue."
    )
    code = tok.encode("for i in range(10):\n    print(i)\n" + "x = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n")
    assert not ids_loop(prose)
    assert not ids_loop(code)
    assert ids_loop(tok.encode("Sure! " + "I can help. " * 12))
    assert ids_loop(tok.encode("the " * 30))
    assert not ids_loop([1, 1, 1])  # too short to judge


def test_hint_goes_to_last_real_user_message_not_openclaw_context():
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "Summarize the file."}]},
        {"role": "user", "content": [{"type": "text", "text": CTX_MARKER + "\nActive exec sessions: none"}]},
    ]
    out = add_hint(messages, "Keep it under 40 words.")
    assert out[3]["content"][0]["text"] == "Summarize the file.\n\n[User's hint: Keep it under 40 words.]"
    assert out[4] == messages[4] and out[1] == messages[1]
    assert messages[3]["content"][0]["text"] == "Summarize the file."  # input untouched


def test_teacher_prompt_is_the_recorded_prompt_plus_hint(default_model_dir, store):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    insert_turn(store, prompt_ids=list(prompt), completion_ids=_ids(8), messages=messages, hint="Answer in one word.")
    sample = select_samples(store, TrainerConfig(), 0, tools_as_text=False).samples[0]
    teacher = teacher_prompt_ids(tok, sample)
    assert teacher is not None and len(teacher) > len(sample.prompt_ids)
    text = tok.decode(teacher)
    assert "[User's hint: Answer in one word.]" in text
    # Same rendering apart from the hint: shared prefix and the same generation-prompt suffix.
    hint_len = len(teacher) - len(sample.prompt_ids)
    assert teacher[-5:] == sample.prompt_ids[-5:]
    assert teacher[: len(sample.prompt_ids) - 8] == sample.prompt_ids[: len(sample.prompt_ids) - 8]
    assert hint_len > 5
    sample.hint = None
    assert teacher_prompt_ids(tok, sample) is None


def test_teacher_prompt_differs_from_the_engine_prompt_by_the_hint_alone(default_model_dir, store):
    """OpenClaw offers tools on every main turn and replays tool calls: the teacher's prompt must
    keep the engine's tool instructions and tool-call history, or the teacher - student gap
    measures a different prompt instead of the hint (it used to drop the tools section, and
    return no teacher at all after a tool call)."""
    import threading
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from clawproxy.engine.server import ServerSettings, _prepare

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    tools = [{"type": "function", "function": {"name": "read", "description": "Read a file",
                                               "parameters": {"type": "object",
                                                              "properties": {"path": {"type": "string"}}}}}]
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Summarize a.txt"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.txt"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "hello world"},
        {"role": "user", "content": [{"type": "text", "text": "Now say it shorter."}]},
        {"role": "user", "content": CTX_MARKER + "\nActive exec sessions: none"},
    ]
    body = {"messages": messages, "tools": tools, "tool_choice": "auto"}
    # the prompt the embedded engine renders and records for this request
    engine = SimpleNamespace(tokenizer=tok, tokenizer_lock=threading.Lock(), adapters_by_name=False)
    prompt = _prepare(engine, ServerSettings("m", "m", 8192), body).prompt_ids
    insert_turn(store, prompt_ids=prompt, completion_ids=_ids(8), messages=messages, tools=tools,
                params={"tool_choice": "auto", "stream": True}, hint="Answer in one sentence.")
    sample = select_samples(store, TrainerConfig(), 0, tools_as_text=True).samples[0]
    teacher = teacher_prompt_ids(tok, sample)
    assert teacher is not None
    a = 0
    while teacher[a] == prompt[a]:
        a += 1
    inserted = len(teacher) - len(prompt)
    assert inserted > 0 and teacher[a + inserted :] == prompt[a:]  # recorded prompt + hint tokens
    assert "[User's hint: Answer in one sentence.]" in tok.decode(teacher[a : a + inserted])
    assert "<tools>" in tok.decode(teacher[:a])


def test_gate_sees_a_sentence_looped_with_variations(default_model_dir):
    """The gate's canary check catches a sentence looped with small changes (the text-level check
    is the proxy's definition of a degenerate turn), and passes ordinary prose."""
    from transformers import AutoTokenizer


    tok = AutoTokenizer.from_pretrained(default_model_dir)
    loop = "To play the guitar, you need to practice regularly. " + " ".join(
        f"You can {'also ' if i % 3 == 0 else ''}practice with a guitar." for i in range(14))
    prose = ("To plan a weekend trip, pick a destination within a few hours of home, check the weather, "
             "book a place to stay early, and list two or three things you want to see. Pack light, "
             "leave room for rest, and keep a small budget for meals and surprises along the way.")
    ids = tok(loop, add_special_tokens=False)["input_ids"]
    assert canary_broken(ids, set(), tok.decode)
    assert not canary_broken(tok(prose, add_special_tokens=False)["input_ids"], set(), tok.decode)


def test_a_turn_served_under_an_instruction_trains_the_student_without_it(store, default_model_dir):
    """The proxy added a preference upstream: the recorded prompt ids hold it. The student's prompt is
    the client's request without it; the teacher's is the request with the active preference, which
    is the served prompt itself; every sample of the user is distilled from that preference."""
    from transformers import AutoTokenizer

    from clawproxy.instruct import add_hint as served_with

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    messages = [{"role": "system", "content": "You are helpful."},
                {"role": "user", "content": "How do clouds form?"}]
    pref = "Use bullet points for lists of items."
    served = prompt_ids(tok, served_with(messages, pref), None, None, tools_as_text=False)
    plain = prompt_ids(tok, messages, None, None, tools_as_text=False)
    tid = insert_turn(store, prompt_ids=served, completion_ids=_ids(8), messages=messages, score=0,
                      hint="An earlier answer got the reply 'hmm'.")
    store.update("turns", "id", tid, {"instruction": pref, "instruction_role": "apply"})
    other = insert_turn(store, prompt_ids=plain, completion_ids=_ids(8, 1), messages=messages, score=0)

    sel = select_samples(store, TrainerConfig(), 0, tools_as_text=False)
    assert [s.turn_id for s in sel.samples] == [tid] and sel.skipped == {other: "score_0"}  # no preference yet
    sel = select_samples(store, TrainerConfig(), 0, tools_as_text=False, distill=pref)
    a, b = sel.samples
    assert (a.turn_id, b.turn_id) == (tid, other) and a.objective == b.objective == "opd"  # a score 0 still teaches the style
    assert a.hint == b.hint == pref and a.served_instruction == pref and b.served_instruction is None
    assert student_prompt_ids(tok, a) == plain != served  # the student never sees the instruction
    assert student_prompt_ids(tok, b) == plain
    assert teacher_prompt_ids(tok, a) == served == teacher_prompt_ids(tok, b)
