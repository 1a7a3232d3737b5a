"""mount.diagnose: counter snapshots in, verdicts (naming the knob) out."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from datamount.mount.diagnose import IDLE, NONE, Watch, diagnose, rates
from datamount.settings import Settings

pytestmark = pytest.mark.unit

SETTINGS = Settings.from_env({}, cpu_count=2)  # 8 read threads, window 32, 4 disk writers


def snap(t: float, cpu: float = 0.0, fs: dict[str, int] | None = None, **cache: int) -> dict:
    return {"updated": t, "cpu_seconds": cpu, "cache": cache, "fs": fs or {}}


def keys(before: dict[str, Any], after: dict[str, Any], settings: Settings = SETTINGS) -> list:
    return [v.key for v in diagnose(before, after, settings)]


def reading(t: float, n: int, cpu: float = 0.0, **cache: int) -> dict:
    """A snapshot after `n` sequential reads served from prefetched blocks."""
    base = {
        "fetch_requests": n,
        "blocks_fetched": n,
        "prefetched_blocks": n,
        "fetch_us": n * 20_000,
    }
    return snap(t, cpu, {"reads": n * 16, "bytes_read": n << 21}, **{**base, **cache})


def test_nothing_read_is_idle_and_no_interval_is_no_verdict() -> None:
    assert diagnose(snap(0), snap(5), SETTINGS) == [IDLE]
    assert diagnose(snap(5), snap(5), SETTINGS) == []


def test_a_healthy_sequential_read_has_no_bottleneck() -> None:
    assert diagnose(snap(0), reading(5, 100, cpu=1.0), SETTINGS) == [NONE]


def test_a_full_prefetch_window_names_the_block_count() -> None:
    after = reading(5, 100, misses=40, prefetch_offers=100, prefetch_window_full=85)
    (verdict,) = diagnose(snap(0), after, SETTINGS)
    assert verdict.key == "prefetch_window"
    assert verdict.line == (
        "prefetch window full 85% of the time: raise DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT (now 32)"
    )
    # The window full while readers never wait (they read slower than storage): no verdict.
    calm = reading(5, 100, misses=0, prefetch_offers=100, prefetch_window_full=85)
    assert keys(snap(0), calm) == ["none"]


def test_all_read_threads_busy_with_low_latency_names_the_thread_count() -> None:
    # 8 threads x 5 s = 40 s of reads in 5 s, 2,000 requests of 20 ms each.
    after = reading(5, 2000)
    (verdict,) = diagnose(snap(0), after, SETTINGS)
    assert verdict.key == "read_threads"
    assert "all DATASET_MOUNT_READ_THREADS busy (8.0 of 8)" in verdict.line
    assert "(20 ms): raise it" in verdict.line
    # Busy because storage is slow (1 s a request): raising threads is not the advice.
    slow = reading(5, 40, fetch_us=40_000_000)
    assert "read_threads" not in keys(snap(0), slow)


def test_throttling_comes_first_and_names_accounts_and_parallelism() -> None:
    after = reading(5, 2000, throttled=300)
    verdicts = diagnose(snap(0), after, SETTINGS)
    assert [v.key for v in verdicts] == ["throttled", "read_threads"]
    assert verdicts[0].line == (
        "storage throttled 13% of requests (429/503): add storage accounts or lower "
        "DATASET_MOUNT_READ_THREADS (now 8)"
    )
    # A few throttled responses among few requests say nothing.
    assert "throttled" not in keys(snap(0), reading(5, 10, throttled=5))


def test_random_readers_get_the_whole_file_or_block_size_advice() -> None:
    after = reading(5, 100, prefetched_blocks=10, misses=90)
    (verdict,) = diagnose(snap(0), after, SETTINGS)
    assert verdict.key == "random_reads"
    assert verdict.line.startswith("readers are random (90% of blocks read on demand)")
    assert "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false" in verdict.line
    assert "DATASET_MOUNT_READ_BLOCK_SIZE (now 2MB)" in verdict.line


def test_skipped_disk_cache_blocks_name_the_write_threads() -> None:
    after = reading(5, 100, disk_queue_dropped=12)
    (verdict,) = diagnose(snap(0), after, SETTINGS)
    assert verdict.key == "disk_queue"
    assert "12 blocks skipped" in verdict.line
    assert "DATASET_MOUNT_BLOCK_FILE_CACHE_WRITE_THREADS (now 4)" in verdict.line


def test_a_cpu_bound_daemon_says_how_many_cores() -> None:
    (verdict,) = diagnose(snap(0, cpu=10.0), reading(5, 100, cpu=14.9), SETTINGS)
    assert verdict.key == "cpu"
    assert verdict.line.startswith("CPU-bound: the daemon used 0.98 cores")


@pytest.mark.parametrize(
    ("env", "knob"),
    [
        ({"DATASET_MOUNT_READ_THREADS": "3"}, "DATASET_MOUNT_READ_THREADS busy (8.0 of 3)"),
        ({"DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "4"}, "BLOCK_COUNT (now 4)"),
    ],
)
def test_the_verdict_shows_the_current_value_of_the_knob(env: dict, knob: str) -> None:
    settings = Settings.from_env(env, cpu_count=2)
    after = reading(5, 2000, misses=100, prefetch_offers=10, prefetch_window_full=9)
    assert any(knob in v.line for v in diagnose(snap(0), after, settings))


def test_rates_between_two_snapshots() -> None:
    before = snap(10, fs={"bytes_read": 0}, bytes_fetched=0, ram_hits=0, misses=0)
    after = snap(12, fs={"bytes_read": 4_000_000}, bytes_fetched=8_000_000, fetch_requests=10,
                 ram_hits=3, disk_hits=1, misses=4)  # fmt: skip
    assert rates(before, after) == {"seconds": 2.0, "storage_mb_s": 4.0, "read_mb_s": 2.0,
                                    "requests_s": 5.0, "hit_ratio": 0.5}  # fmt: skip
    assert rates(after, after) == {}


def test_the_watch_logs_one_line_when_the_verdict_changes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = Watch(SETTINGS, "/mnt/x")
    sequence = [
        snap(0),
        reading(5, 100),  # none
        reading(10, 200),  # none again: no new line
        reading(10.2, 300),  # under a second later: ignored
        reading(15, 300, disk_queue_dropped=5),  # disk queue
        reading(20, 300, disk_queue_dropped=5),  # nothing read: idle
    ]
    with caplog.at_level(logging.INFO, logger="datamount.daemon"):
        got = [watch.update(s) for s in sequence]
    assert [v.key if v else None for v in got] == [
        None, "none", "none", "none", "disk_queue", "idle"
    ]  # fmt: skip
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[1].startswith("/mnt/x: bottleneck: disk-cache queue full, 5 blocks skipped")
    assert watch.rates["seconds"] == 5.0


def test_a_saturated_daemon_is_cpu_bound_below_one_core() -> None:
    # benchmarks/diagnose.py's cpu scenario: 8 threads of 4 KiB reads served from
    # the RAM tier, no storage request, 0.66 cores (the GIL, not the machine, limits).
    fs = {"reads": 49_000, "bytes_read": 49_000 * 4096}
    after = snap(5, cpu=3.3, fs=fs, ram_hits=0, misses=0)
    (verdict,) = diagnose(snap(0, fs={"reads": 0, "bytes_read": 0}), after, SETTINGS)
    assert verdict.key == "cpu"
    assert verdict.line.startswith("CPU-bound: the daemon used 0.66 cores")
    # A healthy sequential read at 0.4 cores is not.
    assert keys(snap(0), reading(5, 100, cpu=2.0)) == ["none"]


def test_a_sequential_reader_behind_a_full_window_is_not_called_random() -> None:
    # benchmarks/diagnose.py's read_threads scenario: 1 read thread, 8 sequential
    # readers; the window turned 94% of prefetches away, so every block was
    # fetched on demand. The readers are not random: the threads and the window are.
    after = reading(5, 265, prefetched_blocks=0, misses=650, prefetch_offers=600,
                    prefetch_window_full=564)  # fmt: skip
    got = keys(snap(0), after, Settings.from_env({"DATASET_MOUNT_READ_THREADS": "1"}, cpu_count=2))
    assert got == ["read_threads", "prefetch_window"]
    # Random preads whose window was mostly free still are.
    rnd = reading(5, 180, prefetched_blocks=2, misses=180, prefetch_offers=100,
                  prefetch_window_full=29)  # fmt: skip
    assert keys(snap(0), rnd) == ["random_reads"]


def test_a_random_reader_whose_prefetches_fill_the_window_is_random() -> None:
    # benchmarks/diagnose.py's random_reads scenario: 64 KiB preads of 2 MiB
    # blocks; the window is full of prefetches never read. The readers used 4%
    # of the bytes fetched: a larger window would only waste more.
    fs = {"reads": 200, "bytes_read": 200 * 65536}
    after = snap(5, fs=fs, fetch_requests=175, blocks_fetched=175, bytes_fetched=175 << 21,
                 fetch_us=175 * 27_000, misses=175, prefetch_offers=150,
                 prefetch_window_full=150)  # fmt: skip
    assert keys(snap(0), after) == ["random_reads"]
