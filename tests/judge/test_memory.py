"""Each user's memory: the reactions the judge scored, in the user's own words, kept per user and
deleted with the turn, the session or the user."""

from __future__ import annotations

import json
import threading

from click.testing import CliRunner

from clawproxy.cli import main
from clawproxy.store import Store
from judge.extract import JudgeInput
from judge.voters import LexicalVoter
from judge.worker import Worker, reaction_text
from tests.judge.conftest import add_turn


def _judge(store: Store) -> None:
    Worker(store, LexicalVoter(), votes=3).run(False, 0.01, threading.Event())


def _own(store: Store, turn_id: int, user: str) -> None:
    store.update("turns", "id", turn_id, {"user": user})


def test_a_scored_reaction_is_remembered_in_the_users_words(store):
    liked = add_turn(store, "s", request="capital of Peru?", response="Lima.",
                     next_user="perfect, thanks! what about Chile?")
    disliked = add_turn(store, "s", request="explain recursion", response="(a long essay)",
                        next_user="way too long, shorter please\n\nnext question: what is a stack?")
    tool = add_turn(store, "t", request="read conf", response=None, tool_result="Error: ENOENT",
                    tool_calls=[{"id": "c", "function": {"name": "read", "arguments": "{}"}}])
    unsure = add_turn(store, "s", request="and Bolivia?", response="Sucre.", next_user="ok")
    _judge(store)
    rows = {r["turn_id"]: r for r in store.reactions_of(None)}
    assert set(rows) == {liked, disliked}  # a tool's output and a 0 verdict are not the user's verdict
    assert rows[liked]["score"] == 1 and rows[liked]["text"] == "perfect, thanks!"
    assert rows[disliked]["score"] == -1 and rows[disliked]["text"] == "way too long, shorter please"
    assert rows[disliked]["response_text"] == "(a long essay)"  # the answer it was about, for the teacher
    assert store.reaction_counts(None) == {1: 1, -1: 1}
    assert [r["turn_id"] for r in store.reactions_of(None, score=-1)] == [disliked]
    assert [r["turn_id"] for r in store.reactions_of(None, before_turn=disliked)] == [liked]
    assert tool not in rows and unsure not in rows


def test_memory_is_per_user_and_goes_with_the_session_and_the_user(store):
    a = add_turn(store, "alice/s1", request="a poem about tea", response="(sonnet)", next_user="too long, a haiku please")
    b = add_turn(store, "bob/s1", request="a poem about tea", response="(haiku)", next_user="lovely, thank you")
    a2 = add_turn(store, "alice/s2", request="a poem about rain", response="(ode)", next_user="wrong, I said short")
    for tid, who in ((a, "alice"), (b, "bob"), (a2, "alice")):
        _own(store, tid, who)
    store.add_user("alice", None)
    store.add_user("bob", None)
    _judge(store)
    assert {r["turn_id"] for r in store.reactions_of("alice")} == {a, a2}
    assert [r["turn_id"] for r in store.reactions_of("bob")] == [b]
    assert store.reactions_of(None) == []
    store.delete_session("alice/s1")
    assert [r["turn_id"] for r in store.reactions_of("alice")] == [a2]
    store.remove_user("alice")
    assert store.reactions_of("alice") == [] and len(store.reactions_of("bob")) == 1
    assert store.query_one("SELECT COUNT(*) AS n FROM reactions")["n"] == 1


def test_reaction_text_keeps_the_reaction_not_the_next_request():
    inp = JudgeInput(request="What's 3 x 4?", response="21.", role="user",
                     next_state="nope, it's 12. Also, what's 7 x 8?")
    assert reaction_text(inp) == "nope, it's 12."
    assert reaction_text(JudgeInput(request="x", response="y", role="tool", next_state="ok")) is None
    long = JudgeInput(request="x", response="y", role="user", next_state="no " * 400)
    assert len(reaction_text(long)) == 500


def test_users_show_prints_what_the_user_told_the_model(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    store = Store(data / "clawproxy.db")
    try:
        store.add_user("alice", None)
        t = add_turn(store, "alice/s", request="summarize this", response="(essay)",
                     next_user="[bold red]way[/] too long, bullet points please")
        _own(store, t, "alice")
        _judge(store)
    finally:
        store.close()
    runner = CliRunner()
    out = runner.invoke(main, ["users", "show", "alice", "--data-dir", str(data)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "[bold red]way[/] too long, bullet points please" in out.output  # the user's words, not markup
    assert "complained" in out.output and "summarize this" in out.output
    assert "1 turn(s) judged, 1 scored, 0 abstained" in out.output
    js = json.loads(runner.invoke(main, ["users", "show", "alice", "--json", "--data-dir", str(data)]).output)
    assert js["complained"] == 1 and js["reactions"][0]["said"].endswith("bullet points please")
    missing = runner.invoke(main, ["users", "show", "carol", "--data-dir", str(data)])
    assert missing.exit_code != 0 and "clawproxy users list" in missing.output
