"""The request's Tap alone, no sockets: fed the events the handler sees, it decides the outcome
once and calls the addons' hooks in order; a hook that raises changes nothing for the request."""

from __future__ import annotations

import logging

import orjson

from clawproxy.proxy.sse import Added
from clawproxy.proxy.tap import Addons, Flow, Outcome, Tap
from tests.rig.fake_upstream import FakeUpstream

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}],
        "logprobs": True, "return_token_ids": True}
BOTH = Added(logprobs=True, token_ids=True)


class Log:
    """An addon that notes every hook with the outcome at that moment."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Outcome | None]] = []

    def request(self, f: Flow) -> None:
        self.calls.append(("request", f.outcome))

    def response(self, f: Flow) -> None:
        self.calls.append(("response", f.outcome))

    def outcome(self, f: Flow) -> None:
        self.calls.append(("outcome", f.outcome))

    def done(self, f: Flow) -> None:
        self.calls.append(("done", f.outcome))


def _tap(*addons: object, chat: bool = True, path: str = "/v1/chat/completions") -> Tap:
    return Tap(Addons(list(addons)), Flow("POST", path, path, chat))


def _admitted(*addons: object) -> Tap:
    tap = _tap(*addons)
    tap.admit("r1", {"x-session-id": "s1"}, None)
    raw = orjson.dumps(BODY)
    tap.body(raw)
    tap.chat_body(orjson.loads(raw))
    return tap


def _events(chunks: int = 3) -> list[bytes]:
    fake = FakeUpstream()
    return list(fake.events(BODY, fake.build_chunks(BODY, "text", chunks)))


def test_a_streamed_turn_ends_ok_once_and_the_hooks_run_in_order():
    log = Log()
    tap = _admitted(log)
    tap.response(200, 7, True, BOTH)
    sent = held = b""
    for ev in _events():
        out = tap.chunk(ev)
        if tap.done:
            held = out  # the read that holds [DONE] waits for the outcome
            break
        sent += out
    assert tap.done and held == b"data: [DONE]\n\n"
    assert b"token_ids" not in sent  # our fields are stripped
    assert tap.end_turn() is Outcome.OK
    tap.client_left()  # the client leaves while [DONE] goes out: the turn stays ok
    tap.close(200)
    assert log.calls == [("request", None), ("response", None), ("outcome", Outcome.OK),
                         ("done", Outcome.OK)]
    cap = tap.flow.capture
    assert cap is not None
    assert (cap.status, cap.http_status, cap.done, cap.header_weight_version) == ("ok", 200, True, 7)
    assert cap.assembled is not None and cap.assembled.completion_token_ids == [100, 101, 102]
    assert tap.flow.client_left and cap.t_first is not None


def test_a_stream_without_done_is_cut_and_recorded_as_an_error():
    log = Log()
    tap = _admitted(log)
    tap.response(200, None, True, Added())
    for ev in _events()[:-1]:
        tap.chunk(ev)
    tap.eof()
    assert tap.flow.outcome is Outcome.CUT
    tap.upstream_failed("a later failure changes nothing")
    tap.close(200)
    cap = tap.flow.capture
    assert cap is not None
    assert (cap.status, cap.error, cap.done) == ("error", "upstream closed the stream before [DONE]", False)
    assert [c for c in log.calls if c[0] == "outcome"] == [("outcome", Outcome.CUT)]


def test_a_stream_of_garbage_or_of_nothing_is_an_error():
    for events, error in ((["data: not json\n\n", "data: [DONE]\n\n"], "upstream sent 1 event(s) that are not JSON"),
                          (["data: [DONE]\n\n"], "upstream stream carried no chunks")):
        tap = _admitted(Log())
        tap.response(200, None, True, Added())
        for ev in events:
            tap.chunk(ev.encode())
        assert tap.end_turn() is Outcome.ERROR
        assert tap.flow.capture is not None and tap.flow.capture.error == error


def test_a_whole_answer_is_stripped_for_the_client_and_kept_whole_for_the_recorder():
    answer = {"id": "x", "model": "m", "prompt_token_ids": [1, 2],
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                           "finish_reason": "stop", "token_ids": [5, 6],
                           "logprobs": {"content": [{"token": "a", "logprob": -0.5}]}}]}
    tap = _admitted(Log())
    tap.response(200, None, False, BOTH)
    out = orjson.loads(tap.answer(orjson.dumps(answer)))
    assert "prompt_token_ids" not in out and out["choices"][0]["logprobs"] is None
    assert tap.end_turn() is Outcome.OK
    asm = tap.flow.capture.assembled  # type: ignore[union-attr]
    assert asm is not None
    assert (asm.text, asm.prompt_token_ids, asm.completion_token_ids, asm.completion_logprobs) == (
        "hello", [1, 2], [5, 6], [-0.5])


def test_an_error_status_is_an_error_with_the_upstreams_body():
    tap = _admitted(Log())
    tap.response(500, None, False, BOTH)
    body = b'{"error": {"message": "boom"}}'
    assert tap.answer(body) == body
    assert tap.end_turn() is Outcome.ERROR
    cap = tap.flow.capture
    assert cap is not None and (cap.status, cap.http_status, cap.error, cap.assembled) == (
        "error", 500, body.decode(), None)


def test_a_failure_before_any_answer_keeps_its_status():
    tap = _admitted(Log())
    tap.fail(502, "upstream unreachable")
    tap.fail(500, "a later fallback")
    tap.close(502)
    cap = tap.flow.capture
    assert cap is not None and (cap.status, cap.http_status, cap.error) == ("error", 502, "upstream unreachable")


def test_a_client_leaving_mid_body_is_aborted():
    log = Log()
    tap = _tap(log)
    tap.admit("r1", {}, "alice")
    tap.client_left("client disconnected while sending the body")
    tap.close(None)
    cap = tap.flow.capture
    assert cap is not None and (cap.status, cap.error, cap.user) == (
        "aborted", "client disconnected while sending the body", "alice")
    assert log.calls[-2:] == [("outcome", Outcome.ABORTED), ("done", Outcome.ABORTED)]


def test_an_exchange_that_ends_with_no_event_is_a_bug_of_ours():
    tap = _admitted(Log())
    assert tap.end_turn() is Outcome.ERROR
    assert tap.flow.error == "proxy error: the exchange ended without an outcome"


def test_a_refused_request_has_no_turn():
    log = Log()
    tap = _tap(log)
    tap.refuse(401, "no token")
    tap.close(401)
    assert tap.flow.capture is None and not tap.flow.admitted
    assert log.calls == [("request", None), ("outcome", Outcome.ERROR), ("done", Outcome.ERROR)]


def test_other_routes_end_by_their_status():
    for status, outcome in ((200, Outcome.OK), (404, Outcome.ERROR)):
        tap = _tap(Log(), chat=False, path="/v1/models")
        tap.admit("", {}, None)
        tap.body(b"")
        tap.response(status, None, False, Added())
        assert tap.answer(b"{}") == b"{}"
        assert tap.end_turn() is outcome and tap.flow.capture is None


def test_a_hook_that_raises_is_logged_and_the_others_still_run(caplog):
    class Broken:
        def outcome(self, f: Flow) -> None:
            raise RuntimeError("addon bug")

    log = Log()
    tap = _admitted(Broken(), log)  # Broken first: the hooks after it must still run
    tap.response(200, None, False, Added())
    tap.answer(b'{"choices": [{"index": 0, "message": {"content": "ok"}}]}')
    with caplog.at_level(logging.ERROR, logger="clawproxy.proxy"):
        assert tap.end_turn() is Outcome.OK
    assert ("outcome", Outcome.OK) in log.calls
    assert any("addon hook" in r.getMessage() and r.exc_info for r in caplog.records)
