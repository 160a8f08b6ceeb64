"""The engine's scheduler in-process (tiny random model): chunked prefill interleaves with decode
steps and stays exact, and the prefix cache serves OpenClaw-shaped traffic (a long system prompt
and tools, a transient last message, side requests) within its memory budget."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from clawproxy.chat_template import render_chat
from clawproxy.engine.embedded.core import Engine
from clawproxy.engine.generation import GenRequest, SamplingParams
from tests.rig.engine_proc import forward_logprobs
from tests.waits import until_sync

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "openclaw_samples.jsonl"


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    # Random init attends almost uniformly, blind to positions; sharpened, a KV entry at the
    # wrong position or a chunk that misses part of its context changes the log-probs.
    for name, p in model.named_parameters():
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            p.data.mul_(40)
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def openclaw() -> dict:
    """OpenClaw's recorded first request, cut to fit the tiny model's 2048 positions."""
    body = next(json.loads(line)["body"] for line in FIXTURE.open()
                if json.loads(line)["label"].startswith("main-turn-1"))
    system, user, transient = body["messages"]
    tools = [t for t in body["tools"] if t["function"]["name"] in ("read", "write")]
    return {"system": {"role": "system", "content": system["content"][:2500]}, "user": user,
            "transient": transient, "tools": tools}


class Run:
    """One request submitted to an in-process engine, its events collected."""

    def __init__(self, engine: Engine, ids: list[int], log: list | None = None, **params) -> None:
        self.events: list = []
        self.done = threading.Event()
        self.log = log

        def emit(ev) -> None:
            self.events.append(ev)
            if self.log is not None:
                self.log.append((self, len(ev.token_ids)))
            if ev.finish_reason is not None:
                self.done.set()

        self.req = GenRequest(prompt_ids=ids, emit=emit,
                              params=SamplingParams(**{"max_tokens": 8, "temperature": 0.0,
                                                       "logprobs": True, **params}))
        engine.submit(self.req)

    def wait(self) -> Run:
        assert self.done.wait(120)
        assert not any(ev.error for ev in self.events)
        return self

    @property
    def ids(self) -> list[int]:
        return [t for ev in self.events for t in ev.token_ids]

    @property
    def logprobs(self) -> list[float]:
        return [lp for ev in self.events for lp in ev.logprobs]


def idle(engine: Engine) -> None:
    """Wait until the worker has retired every row (it caches a row's KV after its last event)."""
    until_sync(lambda: not engine.load()["running"], "the engine retires every row", 60)


def render(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    return tokenizer(render_chat(tokenizer, messages, tools, tools_as_text=True), add_special_tokens=False)["input_ids"]


@pytest.fixture
def make_engine(tiny):
    engines: list[Engine] = []

    def make(**kw) -> Engine:
        engine = Engine(*tiny, threads=1, **kw)
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


def test_a_running_stream_keeps_decoding_while_a_long_prompt_prefills(tiny, make_engine, openclaw):
    """Chunk 32: a ~1.2k-token prompt takes ~40 engine steps to prefill, and the stream already
    running gets a token at each of them; both answers still equal a forward pass."""
    model, tokenizer = tiny
    engine = make_engine(prefill_chunk_tokens=32, prefix_cache_mb=0)
    log: list = []
    short = Run(engine, render(tokenizer, [{"role": "user", "content": "Count to fifty."}]), log,
                max_tokens=200, ignore_eos=True)
    # soon after its first token: the short stream is still decoding when the long prompt comes
    until_sync(lambda: short.events, "the running stream's first token", 60, poll=0.01)
    long_ids = render(tokenizer, [openclaw["system"], openclaw["user"], openclaw["transient"]],
                      openclaw["tools"])
    assert len(long_ids) > 1000
    long = Run(engine, long_ids, log)
    long.wait()
    short.wait()
    order = [run for run, n in log if n]
    start = order.index(short)  # ignore what came before the long request could be scheduled
    first_long = order.index(long)
    interleaved = sum(1 for run in order[start:first_long] if run is short)
    assert interleaved >= len(long_ids) // 32 - 2, interleaved  # 0 or 1 without chunking
    for run in (short, long):
        assert run.logprobs == pytest.approx(forward_logprobs(model, run.req.prompt_ids, run.ids), abs=2e-3)


def test_openclaw_turn_two_prefills_only_its_new_tokens(tiny, make_engine, openclaw):
    """Turn 2 re-sends the history, the answer and a new user message; the transient message of
    turn 1 is not replayed. Everything before it comes from the cache, then the rest is
    prefilled in chunks (another stream is decoding), and the log-probs still equal a forward
    pass."""
    model, tokenizer = tiny
    engine = make_engine(prefill_chunk_tokens=16)
    history = [openclaw["system"], openclaw["user"]]
    turn1 = Run(engine, render(tokenizer, [*history, openclaw["transient"]], openclaw["tools"]),
                max_tokens=12, ignore_eos=True).wait()
    answer = {"role": "assistant", "content": tokenizer.decode(turn1.ids, skip_special_tokens=True)}
    turn2_ids = render(tokenizer, [*history, answer, {"role": "user", "content": "And then?"},
                                   openclaw["transient"]], openclaw["tools"])
    shared = len(render(tokenizer, history, openclaw["tools"])) - 3  # minus "<|im_start|>assistant\n"
    other = Run(engine, render(tokenizer, [{"role": "user", "content": "Hi"}]), max_tokens=500,
                ignore_eos=True)
    # soon after its first token: it is still decoding while turn 2 runs
    until_sync(lambda: other.events, "the other stream's first token", 60, poll=0.01)
    reused_before = engine.prefix_tokens_reused
    turn2 = Run(engine, turn2_ids, max_tokens=10).wait()
    assert not other.done.is_set()
    engine.cancel(other.req)
    reused = engine.prefix_tokens_reused - reused_before
    seen = turn1.req.prompt_ids + turn1.ids[:-1]
    common = next(i for i, (a, b) in enumerate(zip(seen, turn2_ids, strict=False)) if a != b)
    assert shared > 900 and reused == common >= shared  # all that turn 1 had in common
    assert turn2.events[-1].cached_tokens == common  # what the server reports as usage.cached_tokens
    assert turn2.logprobs == pytest.approx(forward_logprobs(model, turn2_ids, turn2.ids), abs=2e-3)


def test_a_side_request_reuses_the_prompt_of_a_request_still_decoding(tiny, make_engine, openclaw):
    """OpenClaw's side turns (memory flush) carry the same system prompt and tools: a prompt's
    KV is cached once prefilled, not only when its request ends."""
    model, tokenizer = tiny
    engine = make_engine()
    system = render(tokenizer, [openclaw["system"]], openclaw["tools"])
    main = Run(engine, render(tokenizer, [openclaw["system"], openclaw["user"]], openclaw["tools"]),
               max_tokens=400, ignore_eos=True)
    # soon after its first token: it is still decoding while the side request runs
    until_sync(lambda: main.events, "the main stream's first token", 60, poll=0.01)
    flush = [openclaw["system"], {"role": "user", "content": "Pre-compaction memory flush. Store durable memories now."}]
    side_ids = render(tokenizer, flush, openclaw["tools"])
    side = Run(engine, side_ids).wait()
    assert not main.done.is_set()  # the side request came and went while main decoded
    assert engine.prefix_hits == 1 and engine.prefix_tokens_reused >= len(system) - 3
    assert side.logprobs == pytest.approx(forward_logprobs(model, side_ids, side.ids), abs=2e-3)
    engine.cancel(main.req)
    main.done.wait(30)


def test_a_cancelled_stream_still_seeds_the_next_turn(tiny, make_engine, openclaw):
    """A user who stops a stream and writes again: the stopped turn's prompt and answer so far
    are reused (a stop is a cancel to the engine)."""
    _, tokenizer = tiny
    engine = make_engine()
    ids = render(tokenizer, [openclaw["system"], openclaw["user"]], openclaw["tools"])
    run = Run(engine, ids, max_tokens=500, ignore_eos=True)
    until_sync(lambda: len(run.ids) >= 5, "five tokens of the stream", 60, poll=0.01)  # stopped well before its 500
    engine.cancel(run.req)
    idle(engine)
    got = run.ids
    Run(engine, ids + got[:-1] + [tokenizer.eos_token_id, 198] * 3, max_tokens=1).wait()
    assert engine.prefix_tokens_reused >= len(ids) + len(got) - 2


def test_the_prefix_cache_keeps_to_its_memory_budget(tiny, make_engine, openclaw):
    """One entry per sequence (the prompt's entry gives way to prompt + answer), least recently
    used out when the next does not fit; the figures on /health say so."""
    _, tokenizer = tiny
    probe = render(tokenizer, [openclaw["system"], openclaw["user"]], openclaw["tools"])
    per_token = 2 * 2 * 2 * 16 * 4  # layers x (k, v) x kv heads x head dim x float32
    budget_mb = 1.5 * (len(probe) + 20) * per_token / 2**20  # one conversation, not two
    engine = make_engine(prefix_cache_mb=budget_mb)
    first = Run(engine, probe, max_tokens=8, ignore_eos=True).wait()
    idle(engine)
    load = engine.load()
    assert load["prefix_cache_entries"] == 1
    assert load["prefix_cache_tokens"] == len(probe) + len(first.ids) - 1
    text = openclaw["system"]["content"]
    other = render(tokenizer, [{"role": "system", "content": text[1250:] + text[:1250]},
                               openclaw["user"]])
    Run(engine, other, max_tokens=8).wait()
    idle(engine)
    load = engine.load()
    assert load["prefix_cache_entries"] == 1 and load["prefix_cache_mb"] <= budget_mb
    hits = engine.prefix_hits
    Run(engine, probe, max_tokens=1).wait()  # evicted: no hit
    assert engine.prefix_hits == hits


def test_prefix_cache_off_keeps_nothing(tiny, make_engine, openclaw):
    _, tokenizer = tiny
    engine = make_engine(prefix_cache_mb=0)
    ids = render(tokenizer, [openclaw["system"], openclaw["user"]])
    Run(engine, ids).wait()
    idle(engine)
    Run(engine, ids).wait()
    assert engine.prefix_hits == 0 and engine.load()["prefix_cache_entries"] == 0
