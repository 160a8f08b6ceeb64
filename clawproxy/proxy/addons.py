"""The proxy's features: small objects with named hooks on a request's events, those that watch
traffic and those that change it alike.

``default_addons`` is the one list, in the order the hooks run; the hooks are described in
``tap.py``. A watching hook that raises is logged and skipped, so a watcher's bug never fails a
request; a changing hook that raises fails its own request only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from clawproxy.proxy.metrics import ProxyMetrics
from clawproxy.proxy.recorder import Recorder
from clawproxy.proxy.redact import redact_body
from clawproxy.proxy.routing import ModelRouter
from clawproxy.proxy.sse import Added
from clawproxy.proxy.tap import Flow, Outcome
from clawproxy.proxy.trying import Trying
from clawproxy.proxy.wire import Outgoing

log = logging.getLogger("clawproxy.proxy")

NOT_FORWARDED = "not_forwarded"  # the route label of a path outside the whitelist


@dataclass
class ProxyStats:
    """Counters served by /clawproxy/stats."""

    requests: int = 0
    chat_requests: int = 0
    errors: int = 0
    aborted: int = 0
    in_flight: int = 0
    started_at: float = 0.0
    # x-weight-version on the upstream's last chat answer (our engine sends it; vLLM does not).
    upstream_weight_version: int | None = None


class Stats:
    """Keeps ``ProxyStats``: requests, errors (an error outcome), aborted (the client left)."""

    def __init__(self, stats: ProxyStats):
        self.stats = stats

    def request(self, flow: Flow) -> None:
        s = self.stats
        s.requests += 1
        if flow.admitted:
            s.in_flight += 1
        if flow.capture is not None:
            s.chat_requests += 1

    def response(self, flow: Flow) -> None:
        if flow.capture is not None and flow.weight_version is not None:
            self.stats.upstream_weight_version = flow.weight_version

    def outcome(self, flow: Flow) -> None:
        if flow.admitted:
            self.stats.in_flight -= 1  # the recorder waits for a moment with none (QUIET_WAIT_S)
        if flow.outcome in (Outcome.ERROR, Outcome.CUT):
            self.stats.errors += 1

    def done(self, flow: Flow) -> None:
        if flow.client_left:
            self.stats.aborted += 1


class Recording:
    """Hands each chat turn to the recorder once its outcome is decided (``recorder`` is set while
    the app runs: ``create_app``'s recorder context)."""

    def __init__(self) -> None:
        self.recorder: Recorder | None = None

    def response(self, flow: Flow) -> None:
        cap, rec = flow.capture, self.recorder
        if cap is not None and rec is not None and rec.redactor is not None:
            # The body's redaction for the journal, while the upstream generates; the turn's end
            # then redacts only the answer before the client's [DONE].
            cap.journal_body = redact_body(rec.redactor, cap.body, cap.raw_body)

    def outcome(self, flow: Flow) -> None:
        if flow.capture is not None and self.recorder is not None:
            self.recorder.submit(flow.capture)


class Metrics:
    """Requests by route and status, the upstream's time and the time the proxy added."""

    def __init__(self, metrics: ProxyMetrics):
        self.metrics = metrics

    def done(self, flow: Flow) -> None:
        status: int | str = "aborted" if flow.client_left or flow.status_sent is None else flow.status_sent
        self.metrics.observe(flow.route or NOT_FORWARDED, status, flow.start, flow.upstream_s)


class TokenFields:
    """Asks the upstream for the sampled token ids and log-probs (vLLM's ``logprobs`` and
    ``return_token_ids``) the client did not ask for; the tap strips them from the answer.

    An upstream that refuses them (a 400 that names them) is asked again without them; only when
    that succeeds were they the problem, and they are never added again: a 400 about the client's
    own fields (say, top_logprobs out of range) must not turn token recording off for everyone.
    """

    def __init__(self, record_tokens: bool):
        self.record_tokens = record_tokens  # proxy.record_tokens
        self.refused = False  # the upstream refused them once: not vLLM-compatible

    def rewrite(self, req: Outgoing) -> None:
        obj = req.obj
        if not req.chat or obj is None or not self.record_tokens or self.refused:
            return
        req.added = Added(logprobs="logprobs" not in obj, token_ids="return_token_ids" not in obj)
        if req.added.logprobs:
            req.set("logprobs", True)
        if req.added.token_ids:
            req.set("return_token_ids", True)

    def answered(self, req: Outgoing, status: int) -> None:
        if "token_fields_dropped" in req.notes and status < 400 and not self.refused:
            self.refused = True
            log.warning("the upstream refuses `logprobs`/`return_token_ids`; recording without "
                        "token ids from now on (set proxy.record_tokens: false to silence this)")

    async def retry(self, req: Outgoing, status: int, data: bytes) -> bool:
        if not req.added or status != 400 or (b"return_token_ids" not in data and b"logprobs" not in data):
            return False
        if req.added.logprobs:
            req.unset("logprobs")
        if req.added.token_ids:
            req.unset("return_token_ids")
        req.added = Added()
        req.notes["token_fields_dropped"] = True
        return True


def default_addons(stats: ProxyStats, recording: Recording, metrics: ProxyMetrics, router: ModelRouter,
                   trying: Trying, tokens: TokenFields, warmup: object | None = None) -> list[object]:
    """Every addon, in the order its hooks run. Watching: the turn is journaled before anything
    else; a request counted in flight, then the engine's warm-up gives way to it (``warmup.py``).
    Changing: routing sets the model, trying puts the instruction on the routed body, and the token
    fields come last (new fields only: when nothing else changed, the client's bytes are spliced,
    not serialized again)."""
    return [recording, Stats(stats), Metrics(metrics), *([warmup] if warmup is not None else []),
            router, trying, tokens]
