"""StreamTap alone, no sockets: an upstream event stream cut into reads at every byte position."""

from __future__ import annotations

import orjson
import pytest

from clawproxy.proxy.sse import Added, StreamTap, assemble_stream
from tests.rig.fake_upstream import FakeUpstream

BOTH = Added(logprobs=True, token_ids=True)


def _stream(ask_tokens: bool, chunks: int = 3) -> bytes:
    fake = FakeUpstream()
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}],
            **({"logprobs": True, "return_token_ids": True} if ask_tokens else {})}
    return b"".join(fake.events(body, fake.build_chunks(body, "text", chunks)))


def _feed(tap: StreamTap, reads: list[bytes]) -> bytes:
    return b"".join(tap.feed(r) for r in reads) + tap.close()


def _splits(raw: bytes) -> list[list[bytes]]:
    """The stream in two reads at every position, and one byte per read."""
    return [[raw[:i], raw[i:]] for i in range(1, len(raw))] + [[raw[i : i + 1] for i in range(len(raw))]]


def test_without_fields_to_strip_every_byte_passes_as_it_arrives():
    raw = _stream(ask_tokens=False)
    for reads in _splits(raw):
        tap = StreamTap()
        assert [tap.feed(r) for r in reads] == reads  # nothing held back
        assert tap.close() == b""
        assert tap.done and tap.generated
        assert tap.chunks == reads


def test_stripping_is_the_same_however_the_stream_is_cut():
    with_fields, without = _stream(ask_tokens=True), _stream(ask_tokens=False)
    ref = assemble_stream(with_fields)
    assert ref.completion_token_ids == [100, 101, 102] and ref.text == "pong: hi part1 part2"
    for reads in _splits(with_fields):
        tap = StreamTap(BOTH)
        assert _feed(tap, reads) == without  # the client gets what it would have asked for
        assert tap.done
        assert tap.turn() == ref  # the recorder gets the turn with the token fields
        assert b"".join(tap.chunks) == with_fields  # and the unstripped bytes, for a failed turn


@pytest.mark.parametrize("sep", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_done_flips_only_once_the_done_event_is_complete(sep):
    head = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}' + sep
    raw = head + b"data: [DONE]" + sep
    for i in range(len(head) + 1, len(raw)):
        tap = StreamTap()
        tap.feed(raw[:i])
        assert not tap.done, i
        tap.feed(raw[i:])
        assert tap.done, i


def test_done_in_generated_text_is_no_end():
    ev = {"choices": [{"index": 0, "delta": {"content": "data: [DONE]\n\n[DONE]"}}]}
    raw = b"data: " + orjson.dumps(ev) + b"\n\n"
    for reads in _splits(raw):
        tap = StreamTap(BOTH)
        _feed(tap, reads)
        assert not tap.done and tap.generated


def test_a_last_event_without_its_blank_line_is_released_at_close():
    tap = StreamTap(BOTH)
    assert tap.feed(b'data: {"choices":[]}\n\ndata: [DONE]') == b'data: {"choices":[]}\n\n'
    assert not tap.done
    assert tap.close() == b"data: [DONE]" and tap.done


def test_generated_waits_for_a_token_not_the_role_chunk():
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    tool = b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}\n\n'
    tap = StreamTap()
    tap.feed(role)
    assert not tap.generated
    tap.feed(tool[:20])
    assert not tap.generated  # half an event proves nothing yet
    tap.feed(tool[20:])
    assert tap.generated


def test_bad_json_and_comments_pass_unchanged_and_are_counted():
    raw = b': keep-alive\n\ndata: {"logprobs": nope}\n\ndata: [1]\n\ndata: [DONE]\n\n'
    tap = StreamTap(BOTH)
    assert _feed(tap, [raw[:7], raw[7:]]) == raw
    assert tap.done
    turn = tap.turn()
    assert turn is not None and (turn.events, turn.bad_events) == (0, 2)


def test_the_turn_is_built_without_fields_to_strip_too():
    raw = _stream(ask_tokens=True)
    tap = StreamTap()
    assert _feed(tap, [raw]) == raw
    assert tap.turn() == assemble_stream(raw)


def test_keep_false_keeps_nothing():
    tap = StreamTap(BOTH, keep=False)
    raw = _stream(ask_tokens=True)
    assert _feed(tap, [raw]) == _stream(ask_tokens=False)
    assert tap.chunks is None and tap.turn() is None and tap.done
