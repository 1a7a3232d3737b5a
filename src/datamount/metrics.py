"""Prometheus metrics of one process (a mount daemon, or a long download or
upload), served on DATAMOUNT_METRICS_HOST:DATAMOUNT_METRICS_PORT.

The counters already exist (read.stats.MountStats, the fs counters, the
retry policy's RetryStats, the memory budget, transfer.progress.Progress):
`SnapshotCollector` turns a snapshot of them into metric families at scrape
time, so the hot path counts once, not twice. Only two things are observed
per request, and only while an endpoint is on: `StorageRequests` (a
response hook of the raw Azure client: requests by operation and status)
the `datamount_storage_request_seconds` histogram (MountStats.on_read) and
the `datamount_fuse_operation_seconds` histogram (fs.lowlevel's funnel).
With metrics off none of this module is even imported.

Threads: prometheus-client's HTTP server thread (scrapes call the snapshot
function there); hooks from any storage thread, under one lock.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from datamount.errors import DataError

# Latency buckets of one storage request, 1 ms .. 60 s (a throttled one takes
# seconds). Why: docs/design/ro_mount.md ("Metrics overhead").
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# FUSE operations: 10 us (a cached getattr) .. 10 s (a cold read behind a slow store)
FUSE_BUCKETS = (1e-5, 5e-5, 1e-4, 5e-4, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 10)

Snapshot = Callable[[], Mapping[str, Any]]


class StorageRequests:
    """hook(method, path, headers, status) of storage.azure_raw: counts
    responses by operation and HTTP status. One dict update per response."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = {}

    def __call__(self, method: str, path: str, headers: Mapping[str, str], status: int) -> None:
        op = _operation(method, headers)
        key = (op, str(status))
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.counts)


def _operation(method: str, headers: Mapping[str, str]) -> str:
    if method == "GET":
        return "read" if "x-ms-range" in headers or "Range" in headers else "get"
    return {"HEAD": "stat", "PUT": "put", "DELETE": "delete"}.get(method, method.lower())


class Endpoint:
    """The registry and its HTTP server; `url` once started."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = StorageRequests()
        self.latency = Histogram(
            "datamount_storage_request_seconds",
            "Seconds of one storage request, by kind (read: a ranged GET of blocks).",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.fuse = Histogram(
            "datamount_fuse_operation_seconds",
            "Seconds of one FUSE operation in the daemon, by operation.",
            ["op"],
            buckets=FUSE_BUCKETS,
            registry=self.registry,
        )
        self.url = ""
        self._server: Any = None

    def observe_read(self) -> Callable[[float], None]:
        return self.latency.labels("read").observe

    def observe_fuse(self) -> Callable[[str, float], None]:
        """observe(op, seconds) for fs.funnel.set_observer; one labelled
        child per operation, made once."""
        children: dict[str, Any] = {}
        labels = self.fuse.labels

        def observe(op: str, seconds: float) -> None:
            child = children.get(op)
            if child is None:
                child = children[op] = labels(op)
            child.observe(seconds)

        return observe

    def add(self, collector: Collector) -> None:
        self.registry.register(collector)

    def start(self, host: str, port: int) -> str:
        """Serve /metrics; DataError (one line) when the address is taken."""
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                why = "already in use (set another DATAMOUNT_METRICS_PORT, or 0 for a free one)"
            else:
                why = exc.strerror or str(exc)
            raise DataError(f"metrics endpoint {host}:{port}: {why}") from None
        self._server = server
        bound_host, bound_port = (str(part) for part in server.server_address[:2])
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.url = f"http://{shown}:{bound_port}/metrics"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


# -- the mount daemon's metrics ----------------------------------------------------

_FS_OPS = ("getattrs", "opens", "reads", "readdirs", "read_errors", "stale_reads")


class MountCollector(Collector):
    """The mount daemon's counters, read at scrape time from `snapshot` (the
    dict the daemon writes to its stats file) and `requests`."""

    def __init__(self, snapshot: Snapshot, requests: StorageRequests | None) -> None:
        self.snapshot = snapshot
        self.requests = requests

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only

    def collect(self) -> Iterator[Any]:
        snap = self.snapshot()
        cache: Mapping[str, int] = snap.get("cache", {})
        fs: Mapping[str, int] = snap.get("fs", {})
        c = cache.get
        yield from self._requests(cache)
        yield _counter("mount_restarts", "Times this mount's daemon died and was started again.",
                       snap.get("restarts", 0))  # fmt: skip
        yield _counter("storage_bytes", "Bytes read from storage by the read path.",
                       c("bytes_fetched", 0))  # fmt: skip
        yield _counter("storage_retries", "Storage requests repeated after a transient error.",
                       c("retries", 0))  # fmt: skip
        yield _counter("storage_throttled", "Retries after a 429 or 503 (storage throttling).",
                       c("throttled", 0))  # fmt: skip
        yield _counter("storage_retries_exhausted", "Storage calls that spent every retry.",
                       c("exhausted", 0))  # fmt: skip
        yield _counter("storage_outages", "Storage outages: a request failed twice in a row.",
                       c("outages", 0))  # fmt: skip
        yield _counter("storage_read_busy_seconds",
                       "Seconds spent in ranged storage reads, summed over read threads.",
                       c("fetch_us", 0) / 1e6)  # fmt: skip
        hits = CounterMetricFamily("datamount_cache_hits", "Block cache hits by tier.",
                                   labels=["tier"])  # fmt: skip
        hits.add_metric(["ram"], c("ram_hits", 0))
        hits.add_metric(["disk"], c("disk_hits", 0))
        yield hits
        yield _counter("cache_misses", "Block reads that missed every cache tier.",
                       c("misses", 0))  # fmt: skip
        evictions = CounterMetricFamily("datamount_cache_evictions", "Blocks evicted by tier.",
                                        labels=["tier"])  # fmt: skip
        evictions.add_metric(["ram"], c("ram_evictions", 0))
        evictions.add_metric(["disk"], c("disk_evictions", 0))
        yield evictions
        prefetch = CounterMetricFamily("datamount_prefetch_blocks",
                                       "Prefetched blocks: fetched, then used or wasted.",
                                       labels=["outcome"])  # fmt: skip
        for outcome, name in (("fetched", "prefetched_blocks"), ("used", "prefetch_used"),
                              ("wasted", "prefetch_wasted")):  # fmt: skip
            prefetch.add_metric([outcome], c(name, 0))
        yield prefetch
        yield _counter("prefetch_window_full",
                       "Prefetch offers turned away by a full prefetch window.",
                       c("prefetch_window_full", 0))  # fmt: skip
        yield _counter("prefetch_offers", "Prefetch offers of the readers.",
                       c("prefetch_offers", 0))  # fmt: skip
        yield _counter("disk_queue_skipped", "Blocks the full disk-cache queue did not write.",
                       c("disk_queue_dropped", 0))  # fmt: skip
        ops = CounterMetricFamily("datamount_fuse_operations", "FUSE operations served.",
                                  labels=["op"])  # fmt: skip
        for op in _FS_OPS:
            ops.add_metric([op], fs.get(op, 0))
        yield ops
        yield _counter("fuse_read_bytes", "Bytes returned to FUSE reads.", fs.get("bytes_read", 0))
        yield _gauge("open_handles", "Files open on the mount.", fs.get("open_files", 0))
        yield _gauge("fuse_reads_in_flight", "FUSE reads being served.",
                     fs.get("reads_in_flight", 0))  # fmt: skip
        yield _counter("metadata_requests", "Listing and stat requests to storage.",
                       fs.get("metadata_requests", 0))  # fmt: skip
        if "uploads_pending" in fs:  # rw_mount
            yield _gauge("upload_backlog_files", "Files staged and not yet uploaded.",
                         fs.get("uploads_pending", 0))  # fmt: skip
            yield _gauge("staged_files", "Files in the rw_mount's staging folder.",
                         fs.get("staged_files", 0))  # fmt: skip
        yield from _budget(snap.get("budget", {}))
        if "cpu_seconds" in snap:
            yield _counter("cpu_seconds", "CPU seconds used by the daemon.", snap["cpu_seconds"])
        verdict = snap.get("verdict")
        if isinstance(verdict, Mapping) and verdict.get("key"):
            bottleneck = GaugeMetricFamily("datamount_bottleneck",
                                           "What limits the mount now (mount.diagnose).",
                                           labels=["verdict"])  # fmt: skip
            bottleneck.add_metric([str(verdict["key"])], 1)
            yield bottleneck

    def _requests(self, cache: Mapping[str, int]) -> Iterator[Any]:
        family = CounterMetricFamily("datamount_storage_requests",
                                     "Storage requests by operation and HTTP status.",
                                     labels=["op", "status"])  # fmt: skip
        counts = self.requests.snapshot() if self.requests is not None else {}
        if not counts and cache.get("fetch_requests"):  # a store without a response hook
            counts = {("read", "ok"): cache["fetch_requests"]}
        for (op, status), n in sorted(counts.items()):
            family.add_metric([op, status], n)
        yield family


def _budget(budget: Mapping[str, Any]) -> Iterator[Any]:
    if not budget:
        return
    limit = GaugeMetricFamily("datamount_memory_budget_bytes",
                              "The memory budget by area (bytes).", labels=["area"])  # fmt: skip
    used = GaugeMetricFamily("datamount_memory_budget_used_bytes",
                             "Bytes of the memory budget in use, by area.",
                             labels=["area"])  # fmt: skip
    for area, n in budget.get("limits", {}).items():
        limit.add_metric([area.replace(" ", "_")], n)
    for area, n in budget.get("used", {}).items():
        used.add_metric([area.replace(" ", "_")], n)
    yield limit
    yield used
    yield _gauge("memory_budget_peak_bytes", "Most bytes of the budget held at once.",
                 budget.get("peak", 0))  # fmt: skip
    yield _gauge("disk_queue_bytes", "Bytes waiting for the disk-cache writers.",
                 budget.get("used", {}).get("disk queue", 0))  # fmt: skip


# -- a download or an upload ---------------------------------------------------------


class TransferCollector(Collector):
    """A running download or upload (transfer.progress.Progress.counts())."""

    def __init__(self, verb: str, snapshot: Snapshot) -> None:
        self.verb = verb
        self.snapshot = snapshot

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        snap = self.snapshot()
        v = self.verb
        yield _counter(f"{v}_bytes", f"Bytes of the {v} done.", snap.get("bytes", 0))
        yield _counter(f"{v}_files", f"Files of the {v} done.", snap.get("files", 0))
        yield _gauge(f"{v}_planned_bytes", f"Bytes the {v} has listed so far.",
                     snap.get("total_bytes", 0))  # fmt: skip
        yield _counter(f"{v}_skipped_bytes", f"Bytes the {v} found already in place.",
                       snap.get("skipped_bytes", 0))  # fmt: skip


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"datamount_{name}", doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"datamount_{name}", doc, value=value)
