"""The simulated OpenClaw client against a fake OpenAI server and the real proxy; the CLI end to end."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner

from clawproxy.simulate.cli import simulate as simulate_cmd
from clawproxy.simulate.driver import Driver, DriverSettings, SimulationError, answer_heldout
from clawproxy.simulate.personas import make_persona
from clawproxy.simulate.prompts import SYSTEM_PROMPT
from clawproxy.simulate.run import StoreView
from tests.waits import until

FILLER = ("Begin with the basics, gather what you need, follow each step carefully, check the result "
          "against what you expected, adjust the timing if something looks wrong, and note what worked "
          "so that next time the whole process goes faster and with fewer surprises for everyone involved "
          "including friends family neighbours colleagues and anybody else nearby today")


class LearningFake:
    """An OpenAI-style streaming server whose answers turn concise after ``learn_after`` main calls.

    Answers restate the question (so they are on topic) and are long (~60 words) until then; the
    weight version goes up when it "learns", like a hot reload would.
    """

    def __init__(self, learn_after: int = 10**9) -> None:
        self.learn_after = learn_after
        self.requests: list[dict[str, Any]] = []
        self.main_calls = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.models)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"headers": dict(request.headers), "body": body})
        if body.get("temperature") != 0.0:
            self.main_calls += 1
        learned = self.main_calls > self.learn_after
        version = 1 if learned else 0
        q = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
        q = q.splitlines()[-1] if isinstance(q, str) else "question"
        text = f"{q} " + ("Start small and practice a little every day." if learned else FILLER)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "x-weight-version": str(version)})
        await resp.prepare(request)
        words = text.split(" ")
        for i in range(0, len(words), 5):
            chunk = {"object": "chat.completion.chunk", "weight_version": version,
                     "choices": [{"index": 0, "delta": {"content": " ".join(words[i:i + 5]) + " "},
                                  "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        end = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await resp.write(b"data: " + json.dumps(end).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def test_driver_talks_like_openclaw(aiohttp_server):
    fake = LearningFake()
    srv = await aiohttp_server(fake.app())
    persona = make_persona("concise", seed=0)
    async with aiohttp.ClientSession() as http:
        driver = Driver(DriverSettings(base_url=str(srv.make_url("")), model="m"), http)
        its = await driver.converse(persona, ["How do I boil an egg?", "How do I make tea?", "Why?"])
    assert len(its) == 3 and len(fake.requests) == 4  # 3 questions + the closing call
    sid = its[0].session_id
    for r in fake.requests:
        h, b = r["headers"], r["body"]
        assert h["session_id"] == h["x-session-affinity"] == f"{sid}:0"
        assert h["Authorization"].startswith("Bearer ")
        assert b["stream"] is True and b["stream_options"] == {"include_usage": True}
        assert b["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    bodies = [r["body"]["messages"] for r in fake.requests]
    for a, b in zip(bodies, bodies[1:], strict=False):  # whole history re-sent, growing by 2
        assert b[: len(a)] == a and len(b) == len(a) + 2
    # The reaction to each answer is the next user message (the turn's next state).
    assert not its[0].met and its[0].intended == -1
    assert its[0].feedback in {c.format(n=f"{len(its[0].answer.split())} words", found="that filler")
                               for c in persona.words.unhappy()}
    assert bodies[1][-1]["content"].startswith(its[0].feedback)
    assert "make tea" in bodies[1][-1]["content"].lower()
    assert bodies[3][-1]["content"] == its[2].feedback  # closing call carries the last reaction
    assert fake.requests[3]["body"]["max_completion_tokens"] == 16
    assert fake.requests[0]["body"]["max_completion_tokens"] == 160
    assert its[0].weight_version == 0 and its[0].finish_reason == "stop"


async def test_heldout_answers_are_greedy_and_marked(aiohttp_server):
    fake = LearningFake()
    srv = await aiohttp_server(fake.app())
    async with aiohttp.ClientSession() as http:
        comps = await answer_heldout(http, str(srv.make_url("")), ["A?", "B?"], via_proxy=True, seed=5)
    assert [c.text.split()[0] for c in comps] == ["A?", "B?"]
    for r in fake.requests:
        assert r["body"]["temperature"] == 0.0 and r["body"]["seed"] == 5
    sids = {r["headers"]["X-Session-Id"] for r in fake.requests}
    assert len(sids) == 2  # a session per prompt: never a trainable next state


async def test_driver_reports_http_errors(aiohttp_server):
    async def fail(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "boom"}}, status=500)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", fail)
    srv = await aiohttp_server(app)
    async with aiohttp.ClientSession() as http:
        driver = Driver(DriverSettings(base_url=str(srv.make_url("")) + "/v1"), http)
        with pytest.raises(SimulationError, match="HTTP 500"):
            await driver.converse(make_persona("concise"), ["Q?"])


async def test_through_the_real_proxy_turns_get_next_states_and_oracle_judgments(make_rig):
    rig = await make_rig()
    persona = make_persona("concise", seed=0)
    async with aiohttp.ClientSession() as http:
        driver = Driver(DriverSettings(base_url=rig.url), http)
        its = await driver.converse(persona, ["How do I boil an egg?", "How do I make tea?"])
    await rig.wait_recorded(3)

    def linked() -> list[dict[str, Any]] | None:
        turns = rig.turns()
        return turns if sum(t["next_state"] is not None for t in turns) >= 2 else None

    turns = await until(linked, "two turns with a next state", poll=0.1)  # each check opens the store
    sid = its[0].session_id
    assert all(t["session_id"] == sid and t["kind"] == "main" for t in turns)
    first, second = turns[0], turns[1]
    assert first["next_state"][0]["content"].startswith(its[0].feedback)
    assert second["next_state"][0]["content"] == its[1].feedback
    assert first["trainable"] == 1 and second["trainable"] == 1, [t["reason"] for t in turns]
    view = StoreView(rig.cfg.data_path)
    try:
        assert view.write_oracle_judgments(its, persona.preference.hint) == 2
        assert view.write_oracle_judgments(its, persona.preference.hint) == 0  # idempotent
        score, n = view.judge_summary([sid])
        assert n == 2 and score == sum(1 if i.met else -1 for i in its) / 2
        rows = view.store.query("SELECT * FROM judgments ORDER BY turn_id")
        assert {r["voter"] for r in rows} == {"oracle"}
        assert all((r["hint"] is None) == (r["score"] == 1) for r in rows)
        assert view.backlog([sid])["unjudged"] == 0
        # the oracle writes the simulator's verdicts, so the agreement is total; nothing trained yet
        assert view.judge_agreement(its) == {"right": 2, "zero": 0, "wrong": 0, "unjudged": 0}
        view.store.execute("UPDATE judgments SET score=0 WHERE turn_id=?", (turns[0]["id"],))
        assert view.judge_agreement(its) == {"right": 1, "zero": 1, "wrong": 0, "unjudged": 0}
        assert view.sample_accounting(its) == {"waiting": 2}
    finally:
        view.close()


class ThreadedServer:
    """An aiohttp app on its own loop in a thread, for code that runs its own asyncio.run()."""

    def __init__(self, app: web.Application) -> None:
        import asyncio
        import threading

        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = self.runner.addresses[0][1]
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-server", daemon=True)
        self.thread.start()

    def close(self) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_simulate_cli_end_to_end_writes_curve(tmp_path):
    """`clawproxy simulate` against a server that 'learns' after 3 main calls: adoption 0 -> 1."""
    fake = LearningFake(learn_after=3)
    server = ThreadedServer(fake.app())
    try:
        url = f"http://127.0.0.1:{server.port}"
        out = tmp_path / "sim"
        res = CliRunner().invoke(simulate_cmd, [
            "--proxy-url", url, "--engine-url", url, "--interactions", "6", "--eval-every", "3",
            "--turns", "3", "--out", str(out)], catch_exceptions=False)
        assert res.exit_code == 0, res.output
    finally:
        server.close()
    doc = json.loads((out / "curve.json").read_text())
    pts = doc["curves"][0]["points"]
    assert [p["interactions"] for p in pts] == [0, 3, 6]
    assert pts[0]["adoption"] == 0.0 and pts[0]["weight_version"] == 0
    assert pts[-1]["adoption"] == 1.0 and pts[-1]["weight_version"] == 1
    assert pts[-1]["degenerate_share"] == 0.0
    assert (out / "curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "adoption" in res.output
    assert pts[-1]["cut_off_share"] == 0.0
    assert doc["curves"][0]["settings"]["feedback"] is None
    peers = doc["curves"][0]["peers"]
    assert peers["effort"] == [3] and peers["streak_at"] is None  # 3 long answers, then one good conversation
    assert set(peers) >= {"effort", "complaints", "streak_at", "told", "capability"}
    assert peers["capability"]["tasks"] == 8 and "base" in peers["capability"] and "final" in peers["capability"]
    assert "user effort" in res.output and "told baseline" in res.output and "capability" in res.output


def test_simulate_cli_rejects_a_bad_feedback_file(tmp_path):
    bad = tmp_path / "fb.yaml"
    bad.write_text("personas: {concise: {praise: [ok]}}\n")
    res = CliRunner().invoke(simulate_cmd, ["--proxy-url", "http://127.0.0.1:9", "--feedback", str(bad)])
    assert res.exit_code != 0 and "fb.yaml" in res.output and "docs/personas.md" in res.output


def test_simulate_cli_rejects_a_bad_persona_file_before_starting_anything(tmp_path):
    bad = tmp_path / "mine.yaml"
    bad.write_text("wants: lists\ntold: Use lists.\ncheck: {lines_matching: {min: 2}}\npraise: [ok]\ncomplaints: [nope]\n")
    res = CliRunner().invoke(simulate_cmd, ["--persona-file", str(bad)])
    assert res.exit_code != 0 and "mine.yaml" in res.output and "check.lines_matching" in res.output
    assert "{pattern: REGEX" in res.output
    res = CliRunner().invoke(simulate_cmd, ["--persona", "bullets", "--persona-file", str(bad)])
    assert res.exit_code != 0 and "one of them" in res.output
