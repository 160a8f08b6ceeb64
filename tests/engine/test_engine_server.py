"""The embedded engine as a real process (tiny random model): the OpenAI surface, vLLM's extras,
exact token ids and log-probs, batching, pause/resume, the openai SDK."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from clawproxy.engine.client import EngineClient
from tests.rig.engine_proc import (
    chat,
    engine_process,
    forward_logprobs,
    get,
    request,
    stream_chat,
)
from tests.waits import until_sync

MSGS = [{"role": "user", "content": "Tell me a story about a cat."}]


@pytest.fixture(scope="module")
def engine_url(tiny_model_dir, tmp_path_factory):
    with engine_process(tiny_model_dir, tmp_path_factory.mktemp("engine-data")) as url:
        yield url


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def test_models_and_health(engine_url):
    health = get(engine_url + "/health").json()
    assert health["status"] == "ok" and health["weight_version"] == 0
    card = get(engine_url + "/v1/models").json()["data"][0]
    assert card["object"] == "model" and card["max_model_len"] == 2048  # the tiny config's limit


def test_non_stream_token_ids_and_logprobs_match_a_forward_pass(engine_url, tiny):
    model, tokenizer = tiny
    r = chat(engine_url, {"model": "x", "messages": MSGS, "max_tokens": 12, "temperature": 0.8,
                          "seed": 7, "logprobs": True, "top_logprobs": 3, "return_token_ids": True})
    assert r.status_code == 200, r.text
    assert r.headers["x-weight-version"] == "0"
    body = r.json()
    assert body["object"] == "chat.completion" and body["weight_version"] == 0
    expected_prompt = tokenizer.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=False)
    assert body["prompt_token_ids"] == tokenizer(expected_prompt, add_special_tokens=False)["input_ids"]
    choice = body["choices"][0]
    ids = choice["token_ids"]
    assert len(ids) == 12 and choice["finish_reason"] == "length"
    n = len(body["prompt_token_ids"])
    cached = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert body["usage"] == {"prompt_tokens": n, "completion_tokens": 12, "total_tokens": n + 12,
                             "prompt_tokens_details": {"cached_tokens": cached}}
    assert cached in (0, n - 1)  # nothing, or all but the token the logits come from
    entries = choice["logprobs"]["content"]
    got = [e["logprob"] for e in entries]
    # Raw log-probs (vLLM's default logprobs_mode): the model's distribution before temperature.
    want = forward_logprobs(model, body["prompt_token_ids"], ids)
    assert got == pytest.approx(want, abs=2e-3)
    for e in entries:
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] >= e["logprob"] - 1e-6
    assert choice["message"]["content"] == tokenizer.decode(ids, skip_special_tokens=True)


def test_stream_matches_non_stream_with_the_same_seed(engine_url):
    req = {"messages": MSGS, "max_tokens": 10, "temperature": 1.0, "top_p": 0.9, "seed": 3,
           "logprobs": True, "return_token_ids": True}
    full = chat(engine_url, req).json()
    chunks, done, headers = stream_chat(engine_url, {**req, "stream_options": {"include_usage": True}})
    assert done and headers["x-weight-version"] == "0"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["prompt_token_ids"] == full["prompt_token_ids"]
    assert all(c["object"] == "chat.completion.chunk" and c["weight_version"] == 0 for c in chunks)
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10
    # the same prompt again: all of it but the last token comes from the prefix cache
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": len(full["prompt_token_ids"]) - 1}
    body = chunks[1:-1]
    ids = [t for c in body for t in c["choices"][0].get("token_ids", [])]
    lps = [e["logprob"] for c in body if c["choices"][0]["logprobs"]
           for e in c["choices"][0]["logprobs"]["content"]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in body)
    assert ids == full["choices"][0]["token_ids"]
    assert lps == pytest.approx([e["logprob"] for e in full["choices"][0]["logprobs"]["content"]], abs=1e-5)
    assert text == full["choices"][0]["message"]["content"]
    assert body[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in body[:-1])


def test_concurrent_requests_are_batched_and_exact(engine_url, tiny):
    """Rows of different lengths share left-padded decode steps; each must equal its solo forward."""
    model, _ = tiny
    prompts = ["Hi", "Write a long poem about the sea and the wind, please.", "2+2?", "Why is the sky blue?"]
    started = []
    lock = threading.Lock()

    def one(text: str) -> dict:
        def seen(chunk: dict) -> None:
            with lock:
                started.append((text, time.monotonic()))

        chunks, done, _ = stream_chat(engine_url, {"messages": [{"role": "user", "content": text}],
                                                   "max_tokens": 24, "temperature": 0,
                                                   "logprobs": True, "return_token_ids": True}, seen)
        assert done
        return {"prompt": chunks[0]["prompt_token_ids"], "end": time.monotonic(),
                "ids": [t for c in chunks[1:] for t in c["choices"][0].get("token_ids", [])],
                "lps": [e["logprob"] for c in chunks[1:] if c["choices"][0]["logprobs"]
                        for e in c["choices"][0]["logprobs"]["content"]]}

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, prompts))
    for res in results:
        assert len(res["ids"]) == 24
        assert res["lps"] == pytest.approx(forward_logprobs(model, res["prompt"], res["ids"]), abs=2e-3)
    # They overlapped: every request had output before the first one finished.
    first_end = min(r["end"] for r in results)
    firsts = {}
    for text, t in started:
        firsts.setdefault(text, t)
    assert len(firsts) == 4 and max(firsts.values()) < first_end


def test_stop_strings(engine_url):
    base = {"messages": MSGS, "max_tokens": 30, "temperature": 1.0, "seed": 11}
    text = chat(engine_url, base).json()["choices"][0]["message"]["content"]
    mid = len(text) // 2
    stop = next(text[i : i + 3] for i in range(mid, len(text) - 3) if text[i : i + 3].strip())
    r = chat(engine_url, {**base, "stop": [stop]}).json()["choices"][0]
    assert r["finish_reason"] == "stop" and r["stop_reason"] == stop
    assert r["message"]["content"] == text[: text.index(stop)]
    chunks, done, _ = stream_chat(engine_url, {**base, "stop": stop})
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert done and streamed == r["message"]["content"] and stop not in streamed


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages"),
        ({"messages": MSGS, "n": 2}, "n"),
        ({"messages": MSGS, "temperature": -1}, "temperature"),
        ({"messages": MSGS, "top_logprobs": 2}, "top_logprobs"),
        ({"messages": MSGS, "max_tokens": 0}, "max_tokens"),
        ({"messages": MSGS, "max_tokens": 10**6}, "messages"),
    ],
)
def test_bad_requests_get_openai_400s(engine_url, body, param):
    r = chat(engine_url, body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["param"] == param and err["message"]


def test_invalid_json_is_a_400(engine_url):
    r = request("POST", engine_url + "/v1/chat/completions", raw=b"{nope")
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_openai_sdk_streaming(engine_url):
    import openai

    client = openai.OpenAI(base_url=engine_url + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="anything", messages=MSGS, max_completion_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert finish == "length" and usage.completion_tokens == 8 and text
    full = client.chat.completions.create(model="anything", messages=MSGS, max_tokens=8, temperature=0)
    assert full.choices[0].message.content == text


def until_health(url: str, check: Callable[[dict], bool], timeout: float = 30.0) -> dict:
    """The engine's /health once ``check`` holds for it (it counts running and waiting requests)."""
    def reached() -> dict | None:
        health = get(url + "/health").json()
        return health if check(health) else None

    return until_sync(reached, "/health to get there", timeout)

def test_pause_keep_freezes_and_resumes_without_errors(engine_url):
    client = EngineClient(engine_url)
    counts: list[int] = []
    got_first = threading.Event()

    def on_chunk(chunk: dict) -> None:
        counts.append(1)
        if len(counts) >= 3:
            got_first.set()

    req = {"messages": MSGS, "max_tokens": 300, "temperature": 0}
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(stream_chat, engine_url, req, on_chunk)
        assert got_first.wait(30)
        client.pause("keep")
        assert client.is_paused()
        frozen = len(counts)
        waiting = pool.submit(chat, engine_url, {"messages": MSGS, "max_tokens": 3})
        held = until_health(engine_url, lambda h: h["waiting"] == 1)  # the new request reached the engine
        assert held["running"] == 1 and held["paused"]  # and is held; the frozen one is kept, not ended
        assert len(counts) <= frozen + 1 and not waiting.done() and not running.done()
        client.resume()
        chunks, done, _ = running.result(60)
        assert done and chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert waiting.result(60).status_code == 200
    assert not client.is_paused()


def test_pause_abort_ends_streams_and_holds_new_requests(engine_url):
    client = EngineClient(engine_url)
    got = threading.Event()
    req = {"messages": MSGS, "max_tokens": 500, "temperature": 0}
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(stream_chat, engine_url, req, lambda c: got.set())
        assert got.wait(30)
        client.pause("abort")
        chunks, done, _ = running.result(30)
        assert done and chunks[-1]["choices"][0]["finish_reason"] == "abort"
        waiting = pool.submit(chat, engine_url, {"messages": MSGS, "max_tokens": 2})
        held = until_health(engine_url, lambda h: h["waiting"] == 1)  # the new request reached the engine
        assert held["running"] == 0 and not waiting.done()  # and waits for the resume
        client.resume()
        assert waiting.result(60).status_code == 200


def test_client_disconnect_frees_the_slot(engine_url):
    import json
    import urllib.request

    body = json.dumps({"messages": MSGS, "max_tokens": 1000, "stream": True}).encode()
    r = urllib.request.urlopen(urllib.request.Request(
        engine_url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}))
    for _ in range(6):
        r.readline()
    assert get(engine_url + "/health").json()["running"] == 1
    r.close()
    until_sync(lambda: not get(engine_url + "/health").json()["running"], "the slot to be freed", 20)
    assert get(engine_url + "/health").json()["running"] == 0
    assert chat(engine_url, {"messages": MSGS, "max_tokens": 2}).status_code == 200


def test_prefix_cache_reuse_is_exact(engine_url, tiny):
    """A follow-up turn reuses the KV of the previous exchange; log-probs still match a fresh
    forward pass, and /reset_prefix_cache empties the cache."""
    model, _ = tiny
    client = EngineClient(engine_url)
    client.reset_prefix_cache()
    first_msgs = [{"role": "user", "content": "Tell me about the moon and its phases."}]
    first = chat(engine_url, {"messages": first_msgs, "max_tokens": 20, "temperature": 0,
                              "return_token_ids": True}).json()
    before = get(engine_url + "/health").json()
    follow = first_msgs + [first["choices"][0]["message"], {"role": "user", "content": "And the sun?"}]
    body = {"messages": follow, "max_tokens": 12, "temperature": 0, "logprobs": True,
            "return_token_ids": True}
    out = chat(engine_url, body).json()
    after = get(engine_url + "/health").json()
    assert after["prefix_cache_hits"] == before["prefix_cache_hits"] + 1
    reused = after["prefix_tokens_reused"] - before["prefix_tokens_reused"]
    assert reused >= len(first["prompt_token_ids"]) - 2  # re-rendering may re-tokenize a seam
    ids, prompt = out["choices"][0]["token_ids"], out["prompt_token_ids"]
    got = [e["logprob"] for e in out["choices"][0]["logprobs"]["content"]]
    assert got == pytest.approx(forward_logprobs(model, prompt, ids), abs=2e-3)
    client.reset_prefix_cache()
    chat(engine_url, body)
    assert get(engine_url + "/health").json()["prefix_cache_hits"] == after["prefix_cache_hits"]


def test_pause_wait_drains_in_flight_requests_first(engine_url):
    client = EngineClient(engine_url)
    got = threading.Event()
    arrived: list[float] = []

    def on_chunk(chunk: dict) -> None:
        arrived.append(time.monotonic())
        got.set()

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(stream_chat, engine_url,
                              {"messages": MSGS, "max_tokens": 300, "temperature": 0}, on_chunk)
        assert got.wait(30)
        asked = time.monotonic()
        client.pause("wait")
        # Still paused, yet the running request completes: wait drained it instead of freezing it.
        chunks, done, _ = running.result(30)
        assert done and chunks[-1]["choices"][0]["finish_reason"] == "length"
        # the request was still decoding when the pause was asked for (not finished before it)
        assert sum(t > asked for t in arrived) >= 2
        assert client.is_paused()
        client.resume()
    assert chat(engine_url, {"messages": MSGS, "max_tokens": 2}).status_code == 200


def test_pause_wait_also_drains_requests_still_queued(tiny):
    """A request accepted before pause(wait) but not yet scheduled is in flight for its client
    (it may already have its first SSE chunk): wait must run it to the end, not park it until
    resume. Deterministic: the worker starts only after the request is queued and the pause set."""
    from clawproxy.engine.embedded.core import Engine
    from clawproxy.engine.generation import GenRequest, SamplingParams

    model, tokenizer = tiny
    engine = Engine(model, tokenizer, threads=1)
    events = []
    prompt = tokenizer.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=False)
    req = GenRequest(prompt_ids=tokenizer(prompt, add_special_tokens=False)["input_ids"],
                     params=SamplingParams(max_tokens=5, temperature=0.0), emit=events.append)
    engine.submit(req)
    with ThreadPoolExecutor(1) as pool:
        paused = pool.submit(engine.pause, "wait", 30.0)
        until_sync(lambda: engine.is_paused, "the pause to be requested first")
        engine.start()
        try:
            paused.result(30)
            assert req.finished and events[-1].finish_reason == "length"
            assert sum(len(e.token_ids) for e in events) == 5
            assert engine.is_paused
        finally:
            engine.resume()
            engine.stop()


def test_resume_before_the_worker_parked_ends_the_pending_pause(tiny):
    """A controller that gave up waiting for pause() resumes: the pause call must return, not
    hold its HTTP handler (and thread) forever waiting for a park that never comes."""
    from clawproxy.engine.embedded.core import Engine

    model, tokenizer = tiny
    engine = Engine(model, tokenizer, threads=1)  # worker not started: it cannot park
    with ThreadPoolExecutor(1) as pool:
        paused = pool.submit(engine.pause, "keep", 5.0)
        until_sync(lambda: engine.is_paused, "the pause to be requested", 5)
        engine.resume()
        paused.result(10)  # returns; EngineError (did not pause in time) before the fix
    assert not engine.is_paused


def test_rope_scaling_serves_past_the_models_trained_length(tiny_model_dir, tmp_path):
    """linear x2 on the tiny model (2048 positions): /v1/models says 4096, a 2.5k-token prompt is
    served, and its log-probs equal a forward pass of the same scaled model."""
    from clawproxy.engine.model import load_model_and_tokenizer

    # Sharper attention than random init gives, so that positions (and their scaling) matter.
    model, tokenizer = load_model_and_tokenizer(str(tiny_model_dir))
    for name, p in model.named_parameters():
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            p.data.mul_(40)
    model_dir = tmp_path / "sharp"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    rope = {"rope_type": "linear", "factor": 2}
    scaled, _ = load_model_and_tokenizer(str(model_dir), rope_scaling=rope)
    long = [{"role": "user", "content": "lorem ipsum " * 800}]
    with engine_process(model_dir, tmp_path, "--rope-scaling", json.dumps(rope),
                        "--prefill-chunk-tokens", "512") as url:
        assert get(url + "/v1/models").json()["data"][0]["max_model_len"] == 4096
        r = chat(url, {"messages": long, "max_tokens": 6, "temperature": 0, "logprobs": True,
                       "return_token_ids": True})
        assert r.status_code == 200, r.text
        out = r.json()
        prompt, ids = out["prompt_token_ids"], out["choices"][0]["token_ids"]
        assert len(prompt) > 2048
        got = [e["logprob"] for e in out["choices"][0]["logprobs"]["content"]]
        assert got == pytest.approx(forward_logprobs(scaled, prompt, ids), abs=2e-3)
        unscaled, _ = load_model_and_tokenizer(str(model_dir))  # the scaling did something
        assert got != pytest.approx(forward_logprobs(unscaled, prompt, ids), abs=2e-3)


def test_max_model_len_above_what_the_model_supports_is_a_startup_error(tiny_model_dir, tmp_path):
    with pytest.raises(RuntimeError, match=r"more than this model supports \(2048"):
        with engine_process(tiny_model_dir, tmp_path, "--max-model-len", "4096"):
            pass
    with pytest.raises(RuntimeError, match="rope_type"):
        with engine_process(tiny_model_dir, tmp_path, "--rope-scaling", '{"rope_type": "ntk", "factor": 2}'):
            pass
