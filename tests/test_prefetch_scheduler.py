"""Scheduler: demand before prefetch, one worker kept for demand, prefetch
dropped cheaply (bounded queue, cancel), promotion, prompt close."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from datamount.read.prefetch.scheduler import Scheduler, SchedulerClosed
from test_reader_fakes import wait_for

pytestmark = pytest.mark.unit


@pytest.fixture
def pools() -> Iterator[Callable[..., Scheduler]]:
    made: list[Scheduler] = []

    def make(threads: int, **kwargs: int) -> Scheduler:
        made.append(Scheduler(threads, **kwargs))
        return made[-1]

    yield make
    for pool in made:
        pool.close()


class Jobs:
    """Records the order jobs ran in; `blocker()` holds a worker until released."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.dropped: list[str] = []
        self.release = threading.Event()
        self.inside = threading.Semaphore(0)
        self._lock = threading.Lock()

    def job(self, name: str) -> Callable[[], None]:
        def run() -> None:
            with self._lock:
                self.ran.append(name)

        return run

    def blocker(self, name: str = "blocker") -> Callable[[], None]:
        def run() -> None:
            self.inside.release()
            assert self.release.wait(10)
            with self._lock:
                self.ran.append(name)

        return run

    def drop(self, name: str) -> Callable[[], None]:
        return lambda: self.dropped.append(name)


def test_demand_jobs_run_before_queued_prefetch_jobs(pools: Callable[..., Scheduler]) -> None:
    pool, jobs = pools(1), Jobs()
    pool.submit(jobs.blocker(), demand=True)
    assert jobs.inside.acquire(timeout=5)
    for name in ("p1", "p2"):
        pool.submit(jobs.job(name), demand=False)
    for name in ("d1", "d2"):
        pool.submit(jobs.job(name), demand=True)
    jobs.release.set()
    wait_for(lambda: len(jobs.ran) == 5)
    assert jobs.ran == ["blocker", "d1", "d2", "p1", "p2"]


def test_one_worker_is_kept_for_demand_while_prefetch_is_stuck(
    pools: Callable[..., Scheduler],
) -> None:
    pool, jobs = pools(3), Jobs()
    for i in range(2):
        pool.submit(jobs.blocker(f"p{i}"), demand=False)
    assert jobs.inside.acquire(timeout=5) and jobs.inside.acquire(timeout=5)
    pool.submit(jobs.blocker("p-queued"), demand=False)
    time.sleep(0.05)
    assert pool.queued() == (0, 1)  # the third worker does not take prefetch work
    done = threading.Event()
    pool.submit(done.set, demand=True)
    assert done.wait(5)  # served while both prefetch workers are stuck
    jobs.release.set()
    wait_for(lambda: len(jobs.ran) == 3)


def test_a_full_prefetch_queue_drops_its_oldest_job(pools: Callable[..., Scheduler]) -> None:
    pool, jobs = pools(1, max_queued_prefetch=2), Jobs()
    pool.submit(jobs.blocker(), demand=True)
    assert jobs.inside.acquire(timeout=5)
    for name in ("p1", "p2", "p3"):
        pool.submit(jobs.job(name), demand=False, on_drop=jobs.drop(name))
    assert jobs.dropped == ["p1"]
    jobs.release.set()
    wait_for(lambda: len(jobs.ran) == 3)
    assert jobs.ran == ["blocker", "p2", "p3"]


def test_cancel_drops_a_queued_job_only(pools: Callable[..., Scheduler]) -> None:
    pool, jobs = pools(1), Jobs()
    running = pool.submit(jobs.blocker(), demand=False, on_drop=jobs.drop("blocker"))
    assert jobs.inside.acquire(timeout=5)
    queued = pool.submit(jobs.job("p1"), demand=False, on_drop=jobs.drop("p1"))
    assert not running.cancel()
    assert queued.cancel()
    assert not queued.cancel()  # on_drop runs once
    assert not queued.promote()
    jobs.release.set()
    pool.submit(jobs.job("after"), demand=True)
    wait_for(lambda: "after" in jobs.ran)
    assert jobs.ran == ["blocker", "after"]
    assert jobs.dropped == ["p1"]


def test_a_promoted_prefetch_job_runs_on_the_demand_lane(
    pools: Callable[..., Scheduler],
) -> None:
    pool, jobs = pools(1), Jobs()
    pool.submit(jobs.blocker(), demand=True)
    assert jobs.inside.acquire(timeout=5)
    pool.submit(jobs.job("p1"), demand=False)
    late = pool.submit(jobs.job("p2"), demand=False)
    assert late.promote()
    assert pool.queued() == (1, 1)
    jobs.release.set()
    wait_for(lambda: len(jobs.ran) == 3)
    assert jobs.ran == ["blocker", "p2", "p1"]
    assert late.promote()  # done: still "will not be lost"


def test_a_failing_job_does_not_kill_its_worker(pools: Callable[..., Scheduler]) -> None:
    pool, jobs = pools(1), Jobs()

    def boom() -> None:
        raise RuntimeError("boom")

    pool.submit(boom, demand=True)
    pool.submit(jobs.job("next"), demand=False)
    wait_for(lambda: jobs.ran == ["next"])


def test_close_drops_queued_jobs_and_returns_promptly() -> None:
    pool, jobs = Scheduler(2), Jobs()
    pool.submit(jobs.blocker(), demand=True)
    assert jobs.inside.acquire(timeout=5)
    gate = threading.Event()
    pool.submit(lambda: gate.wait(10), demand=True)  # the second worker busy too
    for name in ("d1", "p1"):
        pool.submit(jobs.job(name), demand=name[0] == "d", on_drop=jobs.drop(name))
    jobs.release.set()
    gate.set()
    started = time.monotonic()
    pool.close()
    assert time.monotonic() - started < 2
    assert sorted(jobs.dropped + [n for n in jobs.ran if n != "blocker"]) == ["d1", "p1"]
    with pytest.raises(SchedulerClosed):
        pool.submit(jobs.job("late"), demand=True)
    pool.close()  # idempotent


def test_close_does_not_wait_for_queued_work() -> None:
    pool, jobs = Scheduler(1), Jobs()
    pool.submit(jobs.blocker(), demand=True)
    assert jobs.inside.acquire(timeout=5)
    for i in range(100):
        pool.submit(jobs.job(f"p{i}"), demand=False, on_drop=jobs.drop(f"p{i}"))
    closer = threading.Thread(target=pool.close)
    closer.start()
    wait_for(lambda: len(jobs.dropped) == 100)  # dropped before the running job ends
    jobs.release.set()
    closer.join(5)
    assert not closer.is_alive()
    assert jobs.ran == ["blocker"]


def test_threads_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Scheduler(0)
