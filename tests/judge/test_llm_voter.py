"""The LLM voter against a loopback OpenAI-compatible fake (vLLM cannot run here)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from clawproxy.config import load_config
from judge.extract import JudgeInput
from judge.voters import LLMVoter, VoterUnavailable, build_voter

INP = JudgeInput(request="Explain recursion.", response="(600 words)", next_state="too long, 2 lines max",
                 role="user")


class FakeEngine:
    """Answers /v1/models and /v1/chat/completions with queued replies; records request bodies."""

    def __init__(self, replies: list[str], ignore_n: bool = False):
        self.replies = list(replies)
        self.ignore_n = ignore_n
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, obj, status=200):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send({"object": "list", "data": [{"id": "judge-model", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.requests.append(body)
                n = 1 if outer.ignore_n else body.get("n", 1)
                contents = [outer.replies.pop(0) if outer.replies else "Score: 0" for _ in range(n)]
                self._send({"id": "x", "object": "chat.completion", "choices": [
                    {"index": i, "message": {"role": "assistant", "content": c}, "finish_reason": "stop"}
                    for i, c in enumerate(contents)]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="fake-engine", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def test_llm_votes_parse_and_sample_at_temperature():
    replies = ["Score: -1\nHint: Answer in two lines.", "I think it was fine", "Score: +1\nHint: none"]
    with FakeEngine(replies) as fake:
        voter = LLMVoter(fake.url + "/v1", temperature=0.9)
        votes = [voter.vote(INP, i) for i in range(3)]
    assert [v.score for v in votes] == [-1, None, 1]
    assert votes[0].hint == "Answer in two lines."
    assert votes[1].error.startswith("malformed") and votes[1].raw == "I think it was fine"
    body = fake.requests[0]
    assert body["model"] == "judge-model" and body["temperature"] == 0.9 and body["stream"] is False
    prompt = body["messages"][1]["content"]
    assert "Explain recursion." in prompt and "too long, 2 lines max" in prompt  # request in context


def test_m_votes_are_sampled_in_one_request():
    replies = ["Score: -1\nHint: Shorter.", "Score: -1", "Score: 0"]
    with FakeEngine(replies) as fake:
        votes = LLMVoter(fake.url, model="m").votes(INP, 3)
    assert [v.score for v in votes] == [-1, -1, 0]
    assert len(fake.requests) == 1 and fake.requests[0]["n"] == 3


def test_a_server_that_ignores_n_is_asked_again():
    with FakeEngine(["Score: +1", "Score: -1", "Score: +1"], ignore_n=True) as fake:
        votes = LLMVoter(fake.url, model="m").votes(INP, 3)
    assert [v.score for v in votes] == [1, -1, 1]
    assert [r.get("n") for r in fake.requests] == [3, 2, None]


def test_missing_llm_hint_falls_back_to_the_users_words():
    with FakeEngine(["Score: -1\nHint: none"]) as fake:
        vote = LLMVoter(fake.url, model="m").vote(INP, 0)
    assert vote.score == -1 and "2 lines max" in vote.hint


def test_unreachable_endpoint_raises_so_the_turn_is_retried():
    with FakeEngine([]) as fake:
        url = fake.url
    with pytest.raises(VoterUnavailable):
        LLMVoter(url, model="m", timeout_s=2).vote(INP, 0)


def test_build_voter_defaults_to_the_engine_not_the_proxy():
    cfg = load_config(None, {"judge.voter": "llm", "engine.port": 9123})
    voter = build_voter(cfg)
    assert isinstance(voter, LLMVoter) and voter.base_url == "http://127.0.0.1:9123"
    assert voter.model == cfg.engine.served_name  # the base weights, not the adapter being trained
    cfg = load_config(None, {"judge.voter": "llm", "proxy.upstream": "http://10.0.0.5:8000/v1",
                             "judge.llm_url": None})
    assert build_voter(cfg).base_url == "http://10.0.0.5:8000"


# -- judge.hints: llm --------------------------------------------------------------------------

def test_hint_writer_replaces_the_quote_and_the_voter_keeps_the_score(store):
    import threading

    from judge.voters import LexicalVoter, build_hint_writer
    from judge.worker import Worker
    from tests.judge.conftest import add_turn

    bad = add_turn(store, "s1", request="explain recursion", response="(essay)",
                   next_user="ugh, way too long\n\nWhat is a closure?")
    vague = add_turn(store, "s1", request="and iteration?", response="(essay)", next_user="no. shorter!")
    good = add_turn(store, "s2", request="capital of Peru?", response="Lima.", next_user="thanks!")
    with FakeEngine(["Instruction: Answer in two sentences at most.", "none"]) as fake:
        cfg = load_config(None, {"judge.hints": "llm", "judge.llm_url": fake.url + "/v1"})
        writer = build_hint_writer(cfg)
        Worker(store, LexicalVoter(), votes=3, hint_writer=writer).run(False, 0.01, threading.Event())
    rows = {r["turn_id"]: r for r in store.query("SELECT * FROM judgments")}
    assert rows[bad]["score"] == -1 and rows[bad]["hint"] == "Answer in two sentences at most."
    assert rows[vague]["score"] == -1 and "shorter" in rows[vague]["hint"]  # 'none': the quote stands
    assert rows[good]["score"] == 1 and rows[good]["hint"] is None
    assert len(fake.requests) == 2  # only -1 turns are written for
    body = fake.requests[0]
    assert body["temperature"] == 0.0 and "ugh, way too long" in body["messages"][-1]["content"]
    assert "closure" not in body["messages"][-1]["content"]  # the writer sees the reaction, not the next request
    votes = store.query("SELECT hint FROM votes WHERE turn_id = ?", (bad,))
    assert all("too long" in v["hint"] for v in votes)  # the votes keep the voter's own hint


def test_hint_writer_down_keeps_the_quote_and_judges_the_turn(store):
    import threading

    from judge.voters import HintWriter, LexicalVoter
    from judge.worker import Worker
    from tests.judge.conftest import add_turn

    bad = add_turn(store, "s1", request="explain recursion", response="(essay)", next_user="way too long")
    writer = HintWriter(LLMVoter("http://127.0.0.1:9", "m", timeout_s=1.0))  # nothing listens there
    Worker(store, LexicalVoter(), votes=3, hint_writer=writer).run(False, 0.01, threading.Event())
    row = store.query_one("SELECT score, hint FROM judgments WHERE turn_id = ?", (bad,))
    assert row["score"] == -1 and "too long" in row["hint"]


def test_build_hint_writer_uses_the_base_model_of_the_engine():
    from judge.voters import build_hint_writer

    assert build_hint_writer(load_config(None, {})) is None  # quoted hints by default
    cfg = load_config(None, {"judge.hints": "llm", "engine.port": 9123})
    writer = build_hint_writer(cfg)
    assert writer.llm.base_url == "http://127.0.0.1:9123" and writer.llm.model == cfg.engine.served_name


def test_parse_written():
    from judge.hints import parse_written

    assert parse_written("Instruction: Answer briefly.\nmore") == "Answer briefly."
    assert parse_written('"Use bullet points."') == "Use bullet points."
    assert parse_written("none") is None and parse_written("None.") is None and parse_written("") is None
    assert parse_written("x" * 400 + " y").endswith("…")
