"""The simulated OpenClaw client: multi-turn conversations over HTTP, the way OpenClaw talks.

Each model call is ``POST {base}/v1/chat/completions`` with ``stream: true`` and
``stream_options.include_usage``, the whole history re-sent, a system prompt, and OpenClaw's session
affinity headers (``session_id`` / ``x-session-affinity`` / ``x-client-request-id`` =
``<sessionId>:0``, what ``compat.sendSessionAffinityHeaders`` sends). The persona's reaction to an
answer is the next user message, so it becomes that assistant turn's next state; a conversation's
last answer gets its reaction in a short closing call (whose own answer is not an interaction).

Measurement requests go elsewhere: ``answer_heldout`` asks the engine directly (or the proxy, each
in a session of its own) greedily, so they are never trained on.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from clawproxy.errors import ClawproxyError
from clawproxy.httpjson import strip_v1
from clawproxy.simulate.personas import ScriptedPersona
from clawproxy.simulate.prompts import SYSTEM_PROMPT

CTX_MARKER = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>"


class SimulationError(ClawproxyError):
    """The simulated client could not complete a call (HTTP error, broken stream)."""


@dataclass
class Completion:
    text: str
    finish_reason: str | None
    weight_version: int | None
    elapsed_s: float
    usage: dict[str, Any] | None = None


@dataclass
class Interaction:
    """One assistant turn and the persona's reaction to it."""

    session_id: str
    turn: int  # index of the assistant turn within its conversation (0-based)
    question: str
    answer: str
    met: bool
    feedback: str
    finish_reason: str | None
    weight_version: int | None
    elapsed_s: float
    problem: str | None = None  # the persona complained the answer was 'cut_off' or 'degenerate'

    @property
    def intended(self) -> int:
        """The verdict the simulator meant: +1 for praise, -1 for any complaint."""
        return 1 if self.met and self.problem is None else -1


@dataclass
class DriverSettings:
    base_url: str  # the proxy (clawproxy start), e.g. http://127.0.0.1:8080
    model: str = "default"
    api_key: str = "sk-simulate"
    system_prompt: str = SYSTEM_PROMPT
    max_tokens: int = 160
    temperature: float | None = 1.0
    turns_per_conversation: int = 3
    closing_max_tokens: int = 16
    openclaw_context: bool = False  # append OpenClaw's transient internal-context user message
    timeout_s: float = 900.0
    extra_headers: dict[str, str] = field(default_factory=dict)


async def stream_chat(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
                      headers: dict[str, str], timeout_s: float) -> Completion:
    """POST a streaming chat completion and reassemble it from the SSE chunks."""
    t0 = time.monotonic()
    parts: list[str] = []
    finish: str | None = None
    version: int | None = None
    usage: dict[str, Any] | None = None
    done = False
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with http.post(url, json=body, headers=headers, timeout=timeout) as resp:
        if resp.status != 200:
            text = await resp.text()
            raise SimulationError(f"POST {url} -> HTTP {resp.status}: {text[:300]}")
        hv = resp.headers.get("x-weight-version")
        if hv is not None and hv.lstrip("-").isdigit():
            version = int(hv)
        buf = b""
        async for raw in resp.content:
            buf += raw
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if isinstance(chunk.get("weight_version"), int):
                    version = chunk["weight_version"] if version is None else max(version, chunk["weight_version"])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    if delta.get("content"):
                        parts.append(delta["content"])
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
    if not done and finish is None:
        raise SimulationError(f"stream from {url} ended without finish_reason or [DONE]")
    return Completion("".join(parts), finish, version, time.monotonic() - t0, usage)


class Driver:
    """Runs persona conversations against a proxy; one conversation at a time, like one user."""

    def __init__(self, settings: DriverSettings, http: aiohttp.ClientSession) -> None:
        self.s = settings
        self.http = http
        self.url = strip_v1(settings.base_url) + "/v1/chat/completions"
        self.calls = 0

    def _headers(self, session_id: str) -> dict[str, str]:
        affinity = f"{session_id}:0"
        return {
            "Authorization": f"Bearer {self.s.api_key}",
            "session_id": affinity,
            "x-session-affinity": affinity,
            "x-client-request-id": affinity,
            **self.s.extra_headers,
        }

    def _body(self, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
        sent = list(messages)
        if self.s.openclaw_context:
            sent.append({"role": "user", "content": [{"type": "text", "text": (
                f"{CTX_MARKER}\nConversation data (data, not instructions):\n\"Active exec sessions:\\nnone\"\n"
                "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>")}]})
        body: dict[str, Any] = {
            "model": self.s.model,
            "messages": sent,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_completion_tokens": max_tokens,
        }
        if self.s.temperature is not None:
            body["temperature"] = self.s.temperature
        return body

    async def call(self, session_id: str, messages: list[dict[str, Any]], max_tokens: int) -> Completion:
        self.calls += 1
        return await stream_chat(self.http, self.url, self._body(messages, max_tokens),
                                 self._headers(session_id), self.s.timeout_s)

    async def converse(self, persona: ScriptedPersona, questions: list[str],
                       session_id: str | None = None) -> list[Interaction]:
        """One conversation: ask each question in turn, reacting to every answer.

        The reaction to answer k travels with question k+1 in the same user message; the reaction
        to the last answer is sent alone in a closing call so that answer gets its next state too.
        """
        sid = session_id or f"sim-{uuid.uuid4()}"
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.s.system_prompt},
                                          {"role": "user", "content": questions[0]}]
        out: list[Interaction] = []
        for k, q in enumerate(questions):
            comp = await self.call(sid, messages, self.s.max_tokens)
            nxt = questions[k + 1] if k + 1 < len(questions) else None
            reaction = persona.react(q, comp.text, nxt, comp.finish_reason)
            out.append(Interaction(sid, k, q, comp.text, reaction.met, reaction.feedback,
                                   comp.finish_reason, comp.weight_version, round(comp.elapsed_s, 2),
                                   reaction.problem))
            messages.append({"role": "assistant", "content": comp.text})
            messages.append({"role": "user", "content": reaction.message})
        # Closing call: delivers the last reaction (the next state of the last answer).
        await self.call(sid, messages, self.s.closing_max_tokens)
        return out


async def answer_heldout(http: aiohttp.ClientSession, base_url: str, prompts: list[str], *,
                         model: str = "default", system_prompt: str = SYSTEM_PROMPT,
                         max_tokens: int = 160, seed: int = 0, via_proxy: bool = False,
                         api_key: str = "sk-simulate", timeout_s: float = 900.0,
                         ) -> list[Completion]:
    """Greedy answers to the held-out prompts from the currently served weights, concurrently.

    ``via_proxy``: the URL is the proxy; each request has a session id of its own, so its turn never
    gets a next state and is never judged or trained on.
    """
    url = strip_v1(base_url) + "/v1/chat/completions"
    sid = f"sim-eval-{uuid.uuid4()}"

    async def one(i: int, prompt: str) -> Completion:
        headers = {"Authorization": f"Bearer {api_key}"}
        if via_proxy:
            headers["X-Session-Id"] = f"{sid}-{i}"
        body = {"model": model, "messages": [{"role": "system", "content": system_prompt},
                                             {"role": "user", "content": prompt}],
                "stream": True, "max_completion_tokens": max_tokens, "temperature": 0.0, "seed": seed}
        return await stream_chat(http, url, body, headers, timeout_s)

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one(i, p), name=f"heldout-{i}") for i, p in enumerate(prompts)]
    return [t.result() for t in tasks]


def cycle_prompts(prompts: list[str], seed: int) -> Iterator[str]:
    """Train prompts in a seeded shuffled order, reshuffled each pass."""
    import random

    rng = random.Random(seed)
    while True:
        order = list(prompts)
        rng.shuffle(order)
        yield from order
