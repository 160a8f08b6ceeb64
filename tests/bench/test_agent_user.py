"""The agent benchmark's simulated user (clawproxy/simulate/agent_user.py): it praises exactly the
outcomes the task's check passes, and its complaint names what failed. No model runs here."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from clawproxy.simulate.agent_tasks import CATEGORIES, Outcome, check, load_tasks
from clawproxy.simulate.agent_user import (
    COMPLAINTS,
    ORACLE_HINTS,
    PRAISE,
    failure,
    react,
    reaction_message,
)
from tests.bench.test_agent import ws_with_reference

TRAIN = load_tasks(split="train")


def one_of_each_category():
    return [next(t for t in TRAIN if t.category == c) for c in CATEGORIES]


@pytest.mark.parametrize("task", one_of_each_category(), ids=lambda t: t.category)
def test_a_passed_check_is_praised_and_a_failed_one_gets_its_complaint(task, tmp_path: Path):
    rng = random.Random(0)
    ws = ws_with_reference(task, tmp_path)
    right = check(task, Outcome(task.answer or "", [], ws))
    assert right.ok
    text, meant = react(task, right, rng)
    assert (text in PRAISE, meant) == (True, 1)

    empty = tmp_path / "empty"
    empty.mkdir()
    wrong = check(task, Outcome("I could not find it.", [], empty))
    assert not wrong.ok
    text, meant = react(task, wrong, rng)
    expected = {"question": "wrong_answer", "read": "wrong_read", "command": "wrong_command",
                "write": "file_missing"}[task.category]
    assert (failure(task, wrong), meant) == (expected, -1)
    assert text in COMPLAINTS[expected]


def test_a_tool_on_a_plain_question_and_a_wrong_file_have_their_own_complaints(tmp_path: Path):
    question = next(t for t in TRAIN if t.category == "question")
    assert failure(question, check(question, Outcome(question.answer or "", ["read"], tmp_path))) == "tool_on_question"
    write = next(t for t in TRAIN if t.category == "write")
    ws = ws_with_reference(write, tmp_path)
    assert write.file_expect is not None
    (ws / write.file_expect.path).write_text("something else\n")
    assert failure(write, check(write, Outcome("done", ["write"], ws))) == "file_wrong"


def test_reactions_are_seeded_and_every_category_has_an_oracle_hint():
    task = one_of_each_category()[0]
    verdict = check(task, Outcome("no idea", [], Path(".")))
    draws = [react(task, verdict, random.Random(7))[0] for _ in range(3)]
    assert len(set(draws)) == 1
    assert set(ORACLE_HINTS) == set(CATEGORIES)


def test_the_reaction_keeps_openclaws_user_message_form():
    task_msg = {"role": "user", "content": "[Fri 2026-12-04 02:00 UTC] Read notes.txt\n\nRuntime: agent=main | sessionId=s1"}
    msg = reaction_message("That's not right.", task_msg, "Fri 2026-12-04 02:05 UTC")
    assert msg == {"role": "user", "content": "[Fri 2026-12-04 02:05 UTC] That's not right.\n\nRuntime: agent=main | sessionId=s1"}
    parts = {"role": "user", "content": [{"type": "text", "text": "[x] q"}]}
    assert reaction_message("Thanks.", parts, "t")["content"] == "[t] Thanks."
