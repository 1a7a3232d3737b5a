"""RetryPolicy: which errors repeat, how often, how long it waits."""

from __future__ import annotations

import errno
import logging
import random
import threading

import pytest

from datamount.errors import AccessDenied, ObjectNotFound, StorageError, Throttled
from datamount.storage.memory import MemoryStore
from datamount.storage.retry import RetryPolicy, is_transient
from faults import (
    FaultPlan,
    FaultyStore,
    connection_reset,
    forbidden,
    not_found,
    server_error,
    throttled,
)

pytestmark = pytest.mark.unit

DATA = bytes(range(256)) * 40


class FakeSleep:
    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


class MaxRng(random.Random):
    """uniform(a, b) → b: the largest delay jitter may pick."""

    def uniform(self, a: float, b: float) -> float:
        return b


def make(
    plan: FaultPlan, retries: int = 7, rng: random.Random | None = None, **kw: float
) -> tuple[FaultyStore, RetryPolicy, FakeSleep]:
    sleep = FakeSleep()
    policy = RetryPolicy(retries=retries, sleep=sleep, rng=rng or random.Random(1), **kw)
    store = FaultyStore(MemoryStore({"f": DATA}), plan, retry=policy)
    return store, policy, sleep


@pytest.mark.parametrize(
    "error", [server_error(), throttled(), connection_reset(), connection_reset(mapped=True)]
)
def test_success_after_k_failures_returns_data_and_counts_k_retries(error) -> None:
    store, policy, sleep = make(FaultPlan().fail("read", times=3, error=error))
    assert store.read("f", 5, 100) == DATA[5:105]
    assert store.attempts["read"] == 4
    assert policy.stats.retries == 3
    assert len(sleep.delays) == 3
    assert policy.stats.exhausted == 0


def test_transient_errors_retried_up_to_n_then_raised_as_eio() -> None:
    store, policy, sleep = make(FaultPlan().fail("read", times=None, error=server_error()), 4)
    with pytest.raises(StorageError) as info:
        store.read("f", 0, 10)
    assert store.attempts["read"] == 5  # retries + 1
    assert policy.stats.retries == 4 and policy.stats.exhausted == 1
    assert info.value.errno == errno.EIO
    assert not isinstance(info.value, Throttled)
    assert info.value.transient is False  # final: no outer layer repeats it
    assert "gave up after 4 retries" in str(info.value)


@pytest.mark.parametrize("status", [429, 503])
def test_throttling_exhausted_is_throttled_eagain(status: int) -> None:
    store, _, _ = make(FaultPlan().fail(times=None, error=throttled(status=status)), 2)
    with pytest.raises(Throttled) as info:
        store.stat("f")
    assert info.value.errno == errno.EAGAIN
    assert info.value.status == status
    assert store.attempts["stat"] == 3


def test_connection_reset_exhausted_is_eio() -> None:
    store, _, _ = make(FaultPlan().fail("read", times=None, error=connection_reset()), 1)
    with pytest.raises(StorageError) as info:
        store.read("f", 0, 1)
    assert info.value.errno == errno.EIO
    assert isinstance(info.value.__cause__, ConnectionResetError)


@pytest.mark.parametrize(
    ("error", "cls", "code"),
    [(forbidden(), AccessDenied, errno.EACCES), (not_found(), ObjectNotFound, errno.ENOENT)],
)
def test_permanent_errors_are_never_retried(error, cls, code) -> None:
    store, policy, sleep = make(FaultPlan().fail("read", times=None, error=error))
    with pytest.raises(cls) as info:
        store.read("f", 0, 1)
    assert info.value.errno == code
    assert store.attempts["read"] == 1
    assert policy.stats.retries == 0 and sleep.delays == []


def test_real_not_found_is_not_retried() -> None:
    store, _, _ = make(FaultPlan())
    with pytest.raises(ObjectNotFound):
        store.read("missing", 0, 1)
    assert store.attempts["read"] == 1


def test_other_exceptions_pass_through_untouched() -> None:
    policy = RetryPolicy(sleep=FakeSleep())
    calls = []

    def boom() -> None:
        calls.append(1)
        raise KeyError("bug")

    with pytest.raises(KeyError):
        policy.call(boom)
    assert calls == [1]
    assert not is_transient(OSError(errno.ENOSPC, "full"))
    assert is_transient(TimeoutError())


def test_retry_after_is_honoured() -> None:
    store, _, sleep = make(FaultPlan().fail("read", times=2, error=throttled(retry_after=7.5)))
    assert store.read("f", 0, 4) == DATA[:4]
    assert len(sleep.delays) == 2
    assert all(d >= 7.5 for d in sleep.delays)


def test_retry_after_is_capped() -> None:
    plan = FaultPlan().fail("read", times=1, error=throttled(retry_after=3600))
    store, _, sleep = make(plan, max_retry_after=60.0)
    store.read("f", 0, 1)
    assert sleep.delays == [60.0]


def test_backoff_grows_exponentially_and_is_capped() -> None:
    plan = FaultPlan().fail("read", times=None, error=server_error())
    store, _, sleep = make(plan, 10, rng=MaxRng(), base_delay=0.2, max_delay=5.0)
    with pytest.raises(StorageError):
        store.read("f", 0, 1)
    assert sleep.delays == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0, 5.0, 5.0])


def test_jitter_is_bounded_and_varies() -> None:
    policy = RetryPolicy(base_delay=0.2, max_delay=30.0, rng=random.Random(42))
    for attempt in range(12):
        cap = min(30.0, 0.2 * 2**attempt)
        samples = [policy.backoff(attempt) for _ in range(200)]
        assert all(cap / 2 <= s <= cap for s in samples)  # equal jitter: never near 0
        assert len(set(samples)) > 150  # full jitter: not a fixed schedule
    # A huge attempt number neither overflows nor exceeds the cap.
    assert 0.0 <= policy.backoff(10_000) <= 30.0


def test_zero_retries_means_one_attempt() -> None:
    store, policy, sleep = make(FaultPlan().fail("read", times=1, error=server_error()), 0)
    with pytest.raises(StorageError):
        store.read("f", 0, 1)
    assert store.attempts["read"] == 1 and sleep.delays == []
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)


def test_listing_pages_are_retried_in_place() -> None:
    inner = MemoryStore({f"k{i:03d}": b"x" for i in range(25)}, page_size=10)
    plan = FaultPlan().fail("list", times=2, error=server_error())
    policy = RetryPolicy(retries=3, sleep=FakeSleep())
    store = FaultyStore(inner, plan, retry=policy)
    keys = [o.key for page in store.list_pages("") for o in page.objects]
    assert keys == [f"k{i:03d}" for i in range(25)]
    assert inner.requests["list"] == 3  # each page fetched once
    assert store.attempts["list"] == 6  # 2 failures + 3 pages + the end


def test_stats_are_thread_safe() -> None:
    plan = FaultPlan().fail("read", times=400, error=server_error())
    store, policy, _ = make(plan, 1000)
    threads = [
        threading.Thread(target=lambda: [store.read("f", 0, 1) for _ in range(50)])
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert policy.stats.retries == 400
    assert store.attempts["read"] == 400 + 8 * 50


def test_each_retry_is_logged_without_secrets(caplog: pytest.LogCaptureFixture) -> None:
    secret = "sig=SUPERSECRET"

    def fail_once(state: list[int]) -> str:
        state.append(1)
        if len(state) < 3:
            raise ConnectionResetError(errno.ECONNRESET, f"reset talking to /c/b?{secret}")
        return "ok"

    policy = RetryPolicy(sleep=FakeSleep())
    with caplog.at_level(logging.DEBUG, logger="datamount.retry"):
        assert policy.call(fail_once, [], description="read 'b'") == "ok"
    records = [r for r in caplog.records if r.name == "datamount.retry"]
    # two retry lines, and the outage (a second failure in a row) starting and ending
    assert [r.levelname for r in records] == ["DEBUG", "WARNING", "INFO", "WARNING"]
    assert "read 'b'" in records[0].getMessage()
    assert records[1].getMessage().endswith(": ConnectionResetError; retrying up to 7 times")
    assert records[3].getMessage().endswith(" s (1 request retried)")
    assert all(secret not in r.getMessage() for r in records)
