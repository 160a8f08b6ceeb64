"""The features that watch traffic: small objects with named hooks on a request's events.

``default_addons`` is the one list; the hooks and the order they run in are described in
``tap.py``. A hook that raises is logged and skipped, so an addon's bug never fails a request.
"""

from __future__ import annotations

from dataclasses import dataclass

from clawproxy.proxy.metrics import ProxyMetrics
from clawproxy.proxy.recorder import Recorder
from clawproxy.proxy.redact import redact_body
from clawproxy.proxy.tap import Flow, Outcome

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
    # Set when the upstream rejected the token fields we add (not vLLM-compatible): stop adding.
    token_fields_refused: bool = False
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


def default_addons(stats: ProxyStats, recording: Recording, metrics: ProxyMetrics,
                   warmup: object | None = None) -> list[object]:
    """Every addon, in the order its hooks run: the turn is journaled before anything else; a
    request counted in flight, then the engine's warm-up gives way to it (``warmup.py``)."""
    return [recording, Stats(stats), Metrics(metrics), *([warmup] if warmup is not None else [])]
