"""What limits a mount right now, named by the knob that changes it.

`diagnose(before, after, settings)` is a pure function of two snapshots of
the daemon's counters (the dict of its stats file: "updated", "cpu_seconds",
"cache" = read.stats.MountStats plus the retry counters, "fs" = the fs
counters) a few seconds apart: it returns the verdicts that apply, most
pressing first, each one line naming the knob and its value. `rates` gives
the live rates `datamount status` shows. `Watch` keeps the last snapshot in
the daemon, evaluates every stats interval and logs one INFO line when the
verdict changes.

Threads: none of its own; `Watch.update` from the daemon's main thread (and
a metrics scrape reads `Watch.current`, a plain reference).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from datamount.settings import Settings, format_size

log = logging.getLogger("datamount.daemon")

# Thresholds, per evaluation interval (5 s by default).
MIN_REQUESTS = 20  # fewer storage requests than this say nothing about storage
THROTTLED_SHARE = 0.05  # 1 throttled response in 20: the account pushes back
# Cores: CPython serves FUSE and the read path mostly on one, and less than a
# whole one when saturated: its FUSE threads hand the GIL around.
# Why 0.6: docs/design/ro_mount.md ("Diagnosis thresholds").
CPU_BOUND = 0.6
THREADS_BUSY = 0.9  # read threads busy on average, as a share of the pool
LOW_LATENCY = 0.2  # seconds per ranged read: storage answers fast
WINDOW_FULL = 0.5  # share of prefetch offers a full window turned away
RANDOM_SHARE = 0.7  # share of fetched blocks read on demand (not prefetched)
# Share of the fetched bytes the readers read: about 1 for sequential readers, a
# block's fraction for random ones (64 KiB preads of 2 MiB blocks: 0.04). A
# random reader fills the window with prefetches it never reads; a larger window
# is then not the advice.
USED_SHARE = 0.5
MIN_INTERVAL = 1.0  # seconds: a shorter interval is noise


@dataclass(frozen=True)
class Verdict:
    key: str  # the metric label: datamount_bottleneck{verdict=key}
    line: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


IDLE = Verdict("idle", "idle: no reads in the last interval")
NONE = Verdict("none", "no bottleneck found in the mount: the application reads what it gets")


def _delta(before: Mapping[str, Any], after: Mapping[str, Any], part: str, name: str) -> float:
    return float(after.get(part, {}).get(name, 0)) - float(before.get(part, {}).get(name, 0))


def _seconds(before: Mapping[str, Any], after: Mapping[str, Any]) -> float:
    return float(after.get("updated", 0)) - float(before.get("updated", 0))


def rates(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, float]:
    """MB/s from storage and to readers, storage requests/s and the cache hit
    ratio between two snapshots (empty when they are not a second apart)."""
    seconds = float(after.get("updated", 0)) - float(before.get("updated", 0))
    if seconds <= 0:
        return {}
    d = lambda part, name: _delta(before, after, part, name)  # noqa: E731
    hits = d("cache", "ram_hits") + d("cache", "disk_hits")
    lookups = hits + d("cache", "misses")
    return {
        "seconds": round(seconds, 3),
        "storage_mb_s": round(d("cache", "bytes_fetched") / seconds / 1e6, 3),
        "read_mb_s": round(d("fs", "bytes_read") / seconds / 1e6, 3),
        "requests_s": round(d("cache", "fetch_requests") / seconds, 3),
        "hit_ratio": round(hits / lookups, 3) if lookups else 0.0,
    }


def diagnose(
    before: Mapping[str, Any], after: Mapping[str, Any], settings: Settings
) -> list[Verdict]:
    """The verdicts between two snapshots, most pressing first; [IDLE] when
    nothing was read, [NONE] when no rule applies."""
    seconds = float(after.get("updated", 0)) - float(before.get("updated", 0))
    if seconds <= 0:
        return []
    d = lambda name: _delta(before, after, "cache", name)  # noqa: E731
    reads = _delta(before, after, "fs", "reads")
    requests = d("fetch_requests")
    if reads <= 0 and requests <= 0:
        return [IDLE]
    found: list[Verdict] = []
    throttled = d("throttled")
    if (
        requests + throttled >= MIN_REQUESTS
        and throttled / (requests + throttled) >= THROTTLED_SHARE
    ):
        share = throttled / (requests + throttled)
        found.append(
            Verdict(
                "throttled",
                (
                    f"storage throttled {share:.0%} of requests (429/503): "
                    "add storage accounts or lower "
                    f"DATASET_MOUNT_READ_THREADS (now {settings.read_threads})"
                ),
            )
        )
    cores = (float(after.get("cpu_seconds", 0)) - float(before.get("cpu_seconds", 0))) / seconds
    if cores >= CPU_BOUND:
        found.append(
            Verdict(
                "cpu",
                (
                    f"CPU-bound: the daemon used {cores:.2f} cores; larger "
                    f"DATASET_MOUNT_READ_BLOCK_SIZE (now {format_size(settings.read_block_size)}) "
                    "means fewer requests per byte"
                ),
            )
        )
    if d("disk_queue_dropped") > 0:
        found.append(
            Verdict(
                "disk_queue",
                (
                    f"disk-cache queue full, {d('disk_queue_dropped'):.0f} blocks skipped: raise "
                    f"DATASET_MOUNT_BLOCK_FILE_CACHE_WRITE_THREADS (now "
                    f"{settings.block_file_cache_write_threads}) or "
                    "DATASET_MOUNT_BLOCK_FILE_CACHE_MAX_QUEUE_SIZE (now "
                    f"{format_size(settings.block_file_cache_max_queue_size)})"
                ),
            )
        )
    busy = d("fetch_us") / 1e6 / seconds
    latency = d("fetch_us") / 1e6 / requests if requests else 0.0
    if busy >= THREADS_BUSY * settings.read_threads and latency < LOW_LATENCY:
        found.append(
            Verdict(
                "read_threads",
                (
                    f"all DATASET_MOUNT_READ_THREADS busy ({busy:.1f} of {settings.read_threads}) "
                    f"while storage latency is low ({latency * 1000:.0f} ms): raise it"
                ),
            )
        )
    offers = d("prefetch_offers")
    full = d("prefetch_window_full") / offers if offers else 0.0
    fetched = d("bytes_fetched")
    used = _delta(before, after, "fs", "bytes_read") / fetched if fetched else 1.0
    if full >= WINDOW_FULL and d("misses") > 0 and used >= USED_SHARE:
        found.append(
            Verdict(
                "prefetch_window",
                (
                    f"prefetch window full {full:.0%} of the time: raise "
                    "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT "
                    f"(now {settings.read_buffer_block_count})"
                ),
            )
        )
    blocks = d("blocks_fetched")
    demand = blocks - d("prefetched_blocks")
    # A full window turns prefetches away, so a sequential reader's blocks are
    # then read on demand too: when the readers read what was fetched, that is
    # the window's verdict (or the threads'), not the pattern's.
    sequential = full >= WINDOW_FULL and used >= USED_SHARE
    if blocks >= MIN_REQUESTS and demand / blocks >= RANDOM_SHARE and not sequential:
        if settings.block_based_cache_enabled:
            advice = (
                "small files: whole-file mode (DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false); "
                "large files: a smaller DATASET_MOUNT_READ_BLOCK_SIZE (now "
                f"{format_size(settings.read_block_size)})"
            )
        else:
            advice = "block mode (DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=true, now false)"
        found.append(
            Verdict(
                "random_reads",
                (f"readers are random ({demand / blocks:.0%} of blocks read on demand): {advice}"),
            )
        )
    return found or [NONE]


class Watch:
    """The daemon's diagnosis: the last snapshot and the current verdict."""

    def __init__(self, settings: Settings, label: str) -> None:
        self.settings = settings
        self.label = label
        self.previous: Mapping[str, Any] | None = None
        self.current: Verdict | None = None
        self.rates: dict[str, float] = {}

    def update(self, snapshot: Mapping[str, Any]) -> Verdict | None:
        """Evaluate against the previous snapshot; log a changed verdict."""
        before = self.previous
        if before is not None and _seconds(before, snapshot) < MIN_INTERVAL:
            return self.current  # the same moment twice (the daemon's last write and log)
        self.previous = snapshot
        if before is None:
            return self.current
        verdicts = diagnose(before, snapshot, self.settings)
        if not verdicts:
            return self.current
        self.rates = rates(before, snapshot)
        verdict = verdicts[0]
        if self.current is None or verdict.key != self.current.key:
            log.info("%s: bottleneck: %s", self.label, verdict.line)
        self.current = verdict
        return verdict
