"""Prometheus metrics of a kbpg process (prometheus-client): kbpg.telemetry's events, HTTP
requests, and the connection pools read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kbpg import telemetry
from kbpg.store.readiness import PoolStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# a search stage takes from a millisecond (SQL on a small base) to seconds (a chat model)
# queries embedded per model call: up to querybatch.MAX_BATCH
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)
STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Pools(Collector):
    """Pool gauges, read when scraped: connections open, in use, the limit, calls waiting."""

    def __init__(self, stats: Callable[[], list[PoolStats]]) -> None:
        self.stats = stats

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # read at scrape time only (the pools exist once the app runs)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            "size": GaugeMetricFamily(
                "kbpg_pool_connections", "Connections open in the pool", labels=["database"]
            ),
            "in_use": GaugeMetricFamily(
                "kbpg_pool_in_use", "Pooled connections lent to a call", labels=["database"]
            ),
            "max_size": GaugeMetricFamily(
                "kbpg_pool_max_connections", "The pool's size limit", labels=["database"]
            ),
            "waiting": GaugeMetricFamily(
                "kbpg_pool_waiting", "Calls waiting for a pooled connection", labels=["database"]
            ),
        }
        for pool in self.stats():
            for field, family in families.items():
                family.add_metric([pool.database], getattr(pool, field))
        yield from families.values()


class Metrics(telemetry.Observer):
    """kbpg's metrics in a registry of their own (an application embedding kbpg keeps its own).

    Subscribed to kbpg.telemetry while `start()`ed: searches, model calls, replica routing and
    ingest runs in this process are counted, whoever starts them (HTTP, Python, a worker).
    """

    def __init__(self, pool_stats: Callable[[], list[PoolStats]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "kbpg_http_requests",
            "HTTP requests answered, by route and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "kbpg_http_request_duration_seconds",
            "HTTP request time, from the request to the end of the answer",
            ["route"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "kbpg_search_stage_duration_seconds",
            "Time of each stage of a search: embed (the query), sql (kb.search), rerank, expand",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.query_batches = Histogram(
            "kbpg_query_embedding_batch_size",
            "Queries embedded per model call: concurrent searches share one call (the count is"
            " the number of calls, the sum the number of queries)",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.stage_outcomes = Counter(
            "kbpg_search_stage_outcomes",
            "Optional stages by outcome; failed: the search fell back to the plain result",
            ["stage", "status"],
            registry=r,
        )
        self.model_errors = Counter(
            "kbpg_model_errors",
            "Model calls that failed after their retries, by client and reason",
            ["client", "reason"],
            registry=r,
        )
        self.model_retries = Counter(
            "kbpg_model_retries", "Model call attempts retried", ["client"], registry=r
        )
        self.reads = Counter(
            "kbpg_reads",
            "Database reads (searches, listings) by where they ran: primary or a replica",
            ["database"],
            registry=r,
        )
        self.replica_skips = Counter(
            "kbpg_replica_skips",
            "Read replicas left out for a while, by reason (down, behind, busy)",
            ["replica", "reason"],
            registry=r,
        )
        self.pool_exhausted_total = Counter(
            "kbpg_pool_exhausted",
            "Calls refused as Busy: every pooled connection stayed in use",
            ["database"],
            registry=r,
        )
        self.ingest_runs = Gauge("kbpg_ingest_runs", "Ingest runs in progress", registry=r)
        self.ingest_documents_total = Counter(
            "kbpg_ingest_documents",
            "Documents handled by ingest runs, by outcome",
            ["outcome"],
            registry=r,
        )
        self.ingest_chunks_total = Counter(
            "kbpg_ingest_chunks", "Chunks committed by ingest runs", registry=r
        )
        if pool_stats is not None:
            r.register(_Pools(pool_stats))

    def start(self) -> None:
        telemetry.subscribe(self)

    def stop(self) -> None:
        telemetry.unsubscribe(self)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.request_seconds.labels(route).observe(seconds)

    # -- kbpg.telemetry ---------------------------------------------------------------------

    def search_stage(self, stage: str, seconds: float) -> None:
        self.stage_seconds.labels(stage).observe(max(0.0, seconds))

    def query_batch(self, size: int) -> None:
        self.query_batches.observe(size)

    def stage_outcome(self, stage: str, status: str) -> None:
        self.stage_outcomes.labels(stage, status).inc()

    def model_error(self, client: str, reason: str) -> None:
        self.model_errors.labels(client, reason).inc()

    def model_retry(self, client: str) -> None:
        self.model_retries.labels(client).inc()

    def read_routed(self, database: str) -> None:
        self.reads.labels(database).inc()

    def replica_skipped(self, replica: str, reason: str) -> None:
        self.replica_skips.labels(replica, reason).inc()

    def pool_exhausted(self, database: str) -> None:
        self.pool_exhausted_total.labels(database).inc()

    def ingest_running(self, delta: int) -> None:
        self.ingest_runs.inc(delta)

    def ingest_documents(self, outcome: str, count: int) -> None:
        self.ingest_documents_total.labels(outcome).inc(count)

    def ingest_chunks(self, count: int) -> None:
        self.ingest_chunks_total.inc(count)


def expose(metrics: Metrics, port: int, host: str = "127.0.0.1") -> Callable[[], None]:
    """Serve `metrics` at http://host:port/metrics from a thread, for a process without the
    HTTP API (a long `kbpg ingest`); returns the function that stops it."""
    server, thread = start_http_server(port, addr=host, registry=metrics.registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return stop
