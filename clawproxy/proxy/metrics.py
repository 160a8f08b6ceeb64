"""Prometheus metrics for ``/metrics``: one ``CollectorRegistry`` per proxy app.

Two kinds of metric live here:

- the proxy's own, updated on the hot path: requests by route and status, and per request the time
  spent waiting on the upstream and the time the proxy added (a lock and a bucket search each,
  about a microsecond);
- everything else, read only when scraped: the recorder's counters from memory, and the judge's,
  trainer's and engine's state from the store through ``Store.reader`` (a read-only connection that
  never takes a write lock). ``render`` runs the whole collection in a worker thread, so a scrape
  never holds up the event loop.

The metric names are listed in the README's "Metrics" section.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from clawproxy.errors import StoreError
from clawproxy.store import Store

log = logging.getLogger("clawproxy.proxy")

# Added latency is sub-millisecond when all is well (README, Figures); the upstream takes seconds.
ADDED_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
UPSTREAM_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RELOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
# A dashboard tab polls every second or two, and several may be open; the store changes slower.
STORE_READ_INTERVAL_S = 1.0


class ProxyMetrics:
    """The app's registry. ``observe`` is the hot-path call; ``render`` serves a scrape."""

    def __init__(self, recorder_stats: Callable[[], dict[str, Any]], proxy_stats: Callable[[], Any],
                 db_path: Path):
        self.registry = CollectorRegistry()
        self._requests = Counter("clawproxy_requests", "Requests to the forwarded API, by route "
                                 "pattern and the HTTP status sent (aborted: the client left first).",
                                 ["route", "status"], registry=self.registry)
        self._upstream = Histogram("clawproxy_upstream_seconds", "Time a request spent waiting on "
                                   "the upstream: connect, headers and every body read.", ["route"],
                                   buckets=UPSTREAM_BUCKETS, registry=self.registry)
        self._added = Histogram("clawproxy_added_seconds", "Time a request spent in the proxy's own "
                                "work: from its body received to its last byte sent, less the waits "
                                "on the upstream (an upper bound on the latency it added, as that "
                                "work overlaps the upstream's generation).",
                                ["route"], buckets=ADDED_BUCKETS, registry=self.registry)
        # Children cached per label value: labels() validates and locks on every call.
        self._req_children: dict[tuple[str, str], Any] = {}
        self._lat_children: dict[str, tuple[Any, Any]] = {}
        self.store_collector = StoreCollector(db_path)
        self.registry.register(_ProcessCollector(recorder_stats, proxy_stats))
        self.registry.register(self.store_collector)

    def observe(self, route: str, status: int | str, start: float | None, upstream_s: float | None) -> None:
        """One request ended; ``start``: perf_counter when its body was in, ``upstream_s``: time
        it waited on the upstream (None: never asked)."""
        key = (route, str(status))
        child = self._req_children.get(key)
        if child is None:
            child = self._req_children[key] = self._requests.labels(*key)
        child.inc()
        if upstream_s is None or start is None:
            return
        lat = self._lat_children.get(route)
        if lat is None:
            lat = self._lat_children[route] = (self._upstream.labels(route), self._added.labels(route))
        lat[0].observe(upstream_s)
        lat[1].observe(max(0.0, time.perf_counter() - start - upstream_s))

    async def render(self, accept: str | None) -> tuple[bytes, str]:
        """(body, content type) in the format the scraper asked for, collected off the event loop."""
        encoder, content_type = choose_encoder(accept or "")
        return await asyncio.to_thread(encoder, self.registry), content_type

    def close(self) -> None:
        self.store_collector.close()


class _ProcessCollector:
    """What the proxy process knows in memory: the recorder's counters and requests in flight."""

    def __init__(self, recorder_stats: Callable[[], dict[str, Any]], proxy_stats: Callable[[], Any]):
        self._recorder_stats, self._proxy_stats = recorder_stats, proxy_stats

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        rs = self._recorder_stats()
        yield GaugeMetricFamily("clawproxy_in_flight", "Forwarded requests in progress.",
                                value=self._proxy_stats().in_flight)
        yield GaugeMetricFamily("clawproxy_recorder_queue_depth", "Captured turns waiting for the "
                                "recorder's writer thread.", value=rs["queue_depth"])
        yield CounterMetricFamily("clawproxy_recorder_turns_recorded", "Turns the recorder wrote to "
                                  "the store since the proxy started.", value=rs["turns_recorded"])
        yield GaugeMetricFamily("clawproxy_recorder_spool_records", "Turns in spool.jsonl, waiting "
                                "for the store to accept writes again.", value=rs["spool_records"])
        yield GaugeMetricFamily("clawproxy_recorder_quarantined", "Records the store refused, kept "
                                "in the quarantine table (or file) with the reason.",
                                value=rs["quarantined"])
        yield CounterMetricFamily("clawproxy_recorder_turns_lost", "Turns neither stored, spooled "
                                  "nor quarantined since the proxy started.", value=rs["turns_lost"])
        yield GaugeMetricFamily("clawproxy_recorder_store_ok", "1 while the store accepts the "
                                "recorder's writes, 0 while they go to the spool.",
                                value=1 if rs["store_ok"] else 0)
        wv = self._proxy_stats().upstream_weight_version
        if wv is not None:
            yield GaugeMetricFamily("clawproxy_upstream_weight_version", "The weight version the "
                                    "upstream reported (x-weight-version) on its last chat answer.",
                                    value=wv)


class StoreCollector:
    """The judge's, trainer's and engine's state, read from the store at scrape time.

    Those run in other processes; the store is what they share. The read-only connection is opened
    on the first scrape (the recorder creates and migrates the store at start) and kept. The reads
    grow with the store (about 30 ms at 5,000 judged turns), so they run at most once per
    ``STORE_READ_INTERVAL_S`` however many scrapers poll, and votes, the largest table, are counted
    incrementally by id.
    """

    def __init__(self, db_path: Path):
        self.db_path = db_path
        self._store: Store | None = None
        self._lock = threading.Lock()
        self._warned = False
        self._cached: list[Metric] = []
        self._read_at = -math.inf
        self._votes: dict[tuple[str, int | None], int] = {}
        self._votes_last_id = 0

    def describe(self) -> list[Metric]:
        return []

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def _open(self) -> Store | None:
        if self._store is None:
            try:
                self._store = Store.reader(self.db_path)
            except StoreError as e:
                if not self._warned:
                    log.warning("/metrics: the store's metrics are left out: %s", e.message)
                    self._warned = True
                return None
        return self._store

    def collect(self) -> list[Metric]:
        with self._lock:
            if time.monotonic() - self._read_at >= STORE_READ_INTERVAL_S or self._store is None:
                self._cached = self._read()
                self._read_at = time.monotonic()
            readable = GaugeMetricFamily("clawproxy_store_readable", "1 when /metrics could read the "
                                         "store (the judge, trainer and engine metrics come from it).",
                                         value=1 if self._store is not None else 0)
            return [readable, *self._cached]

    def _read(self) -> list[Metric]:
        store = self._open()
        if store is None:
            return []
        try:
            with store.snapshot():
                return list(_store_metrics(store, self._count_votes(store)))
        except sqlite3.Error as e:  # the file replaced or gone: reopen on the next scrape
            log.warning("/metrics: reading the store failed: %s", e)
            store.close()
            self._store = None
            self._votes, self._votes_last_id = {}, 0
            return []

    def _count_votes(self, store: Store) -> dict[tuple[str, int | None], int]:
        """Votes by (voter, score): the new ones added to the last count. Within a snapshot, so a
        total that does not match means votes were deleted: then all are counted again."""
        for r in store.vote_counts(after_id=self._votes_last_id):
            key = (r["voter"], r["score"])
            self._votes[key] = self._votes.get(key, 0) + r["n"]
            self._votes_last_id = max(self._votes_last_id, r["last_id"])
        if sum(self._votes.values()) != store.vote_count():
            self._votes, self._votes_last_id = {}, 0
            return self._count_votes(store)
        return self._votes


def _store_metrics(store: Store, vote_counts: dict[tuple[str, int | None], int]) -> Iterator[Metric]:
    votes = CounterMetricFamily("clawproxy_judge_votes", "Judge votes by voter and score (1, 0, "
                                "-1; failed: the voter gave no verdict).", labels=["voter", "score"])
    for (voter, score), n in sorted(vote_counts.items(), key=str):
        votes.add_metric([voter, _score(score)], n)
    yield votes
    judged = CounterMetricFamily("clawproxy_judge_judgments", "Judged turns by majority score.",
                                 labels=["score"])
    for score, n in sorted(store.judgment_counts().items()):
        judged.add_metric([_score(score)], n)
    yield judged
    backlog = store.judge_backlog()
    yield GaugeMetricFamily("clawproxy_judge_pending_turns", "Trainable main turns with a next "
                            "state and no judgment yet.", value=backlog["pending"])
    since = backlog["since"]
    yield GaugeMetricFamily("clawproxy_judge_lag_seconds", "How long the oldest pending turn has "
                            "waited for its judgment since its next state arrived (0: none waits).",
                            value=max(0.0, time.time() - since) if since is not None else 0.0)

    steps = CounterMetricFamily("clawproxy_trainer_steps", "Trainer steps by outcome (published, "
                                "gate_failed, error, superseded).", labels=["status"])
    for status, n in sorted(store.step_counts().items()):
        steps.add_metric([status], n)
    yield steps
    yield CounterMetricFamily("clawproxy_trainer_samples_trained", "Turns trained on, over all "
                              "steps.", value=store.trained_sample_count())
    skipped = CounterMetricFamily("clawproxy_trainer_samples_skipped", "Turns the trainer will "
                                  "never train on, by reason.", labels=["reason"])
    for reason, n in sorted(store.skipped_by_reason().items()):
        skipped.add_metric([reason], n)
    yield skipped
    last = store.last_step_losses()
    if last is not None:
        for key, name in (("loss", "clawproxy_trainer_last_loss"), ("kl", "clawproxy_trainer_last_kl")):
            if last[key] is not None:
                yield GaugeMetricFamily(name, f"The {key} of the newest train step.", value=last[key])

    durations = store.reload_durations()
    reloads = HistogramMetricFamily("clawproxy_engine_reload_seconds", "Engine reload time of each "
                                    "published checkpoint (validation and the engine's load).")
    reloads.add_metric([], _buckets(durations, RELOAD_BUCKETS), sum_value=math.fsum(durations))
    yield reloads
    newest = store.serving_checkpoint()
    yield GaugeMetricFamily("clawproxy_weight_version", "The newest published weight version, "
                            "the one the engine serves (0: the base model).",
                            value=newest["version"] if newest else 0)
    if newest:
        yield GaugeMetricFamily("clawproxy_weight_version_published_timestamp_seconds", "When the "
                                "serving weight version was published (Unix time).",
                                value=newest["created_at"])


def _score(score: int | None) -> str:
    return "failed" if score is None else str(int(score))


def _buckets(values: list[float], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs, +Inf last, as HistogramMetricFamily takes them."""
    out = [(repr(b), float(sum(v <= b for v in values))) for b in bounds]
    return [*out, ("+Inf", float(len(values)))]
