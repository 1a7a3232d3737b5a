"""RetryPolicy's time budget: the backoff schedule before giving up, the
outage lines shared by many callers, the early wake when storage answers
again, and the policy the settings build."""

from __future__ import annotations

import dataclasses
import logging
import random
import re
import threading
import time

import pytest

from datamount.errors import StorageError
from datamount.settings import Settings
from datamount.storage.retry import DEFAULT_MIN_SECONDS, RetryPolicy

pytestmark = pytest.mark.unit

SECRET = "sig=SUPERSECRET"


def down(_state: object = None) -> None:
    raise ConnectionRefusedError(111, f"refused by /c/b?{SECRET}")


def schedule(seed: int, retries: int, budget: float) -> tuple[list[float], int]:
    """The delays slept before giving up on a call that always fails, and the
    attempts it made."""
    delays: list[float] = []
    attempts = [0]

    def fn() -> None:
        attempts[0] += 1
        down()

    policy = RetryPolicy(
        retries=retries, sleep=delays.append, rng=random.Random(seed), min_seconds=budget
    )
    with pytest.raises(StorageError) as info:
        policy.call(fn, description="read 'b'")
    assert info.value.exhausted and not info.value.transient
    return delays, attempts[0]


@pytest.mark.parametrize(("retries", "budget"), [(0, 0.0), (1, 0.0), (7, 0.0), (0, 1.0),
                                                 (7, 60.0), (3, 300.0), (20, 5.0)])  # fmt: skip
def test_for_any_seed_the_delays_fill_the_budget_and_the_attempts_the_count(
    retries: int, budget: float
) -> None:
    # the count alone: every cap of the first `retries` delays, the most they add up to
    count_phase = sum(min(30.0, 0.2 * 2**n) for n in range(retries))
    for seed in range(300):
        delays, attempts = schedule(seed, retries, budget)
        assert sum(delays) >= budget
        assert attempts >= retries + 1 and len(delays) == attempts - 1
        # and no more than needed: the budget plus one base delay, or the count's own waits
        assert sum(delays) <= max(budget + 0.2, count_phase) + 1e-9


def test_equal_jitter_keeps_the_count_phase_above_half_its_caps() -> None:
    # 7 retries with full jitter added up to under 6 s for ~6% of requests;
    # equal jitter cannot go below half the caps: 12.7 s.
    totals = [sum(schedule(seed, 7, 0.0)[0]) for seed in range(500)]
    assert min(totals) >= 12.7 - 1e-9
    assert max(totals) <= 25.4 + 1e-9
    assert len({round(t, 6) for t in totals}) == 500  # jittered, not a fixed schedule


def test_the_last_waits_are_cut_to_the_budget() -> None:
    delays, attempts = schedule(5, 2, 10.0)
    assert sum(delays) == pytest.approx(10.0)  # the last wait is what was left
    assert attempts == len(delays) + 1 >= 3


def test_slow_attempts_count_towards_the_budget() -> None:
    """The budget is time since the first failure: attempts that take 25 s
    each (a connect timeout) spend it faster than the waits alone."""
    now = [0.0]
    delays: list[float] = []

    def slow_fail() -> None:
        now[0] += 25.0
        down()

    policy = RetryPolicy(retries=1, sleep=delays.append, min_seconds=60.0, clock=lambda: now[0])
    with pytest.raises(StorageError) as info:
        policy.call(slow_fail, description="read 'b'")
    assert len(delays) == 3  # failures at 25, 50, 75 s (+ waits): the fourth gives up
    assert "(gave up after 3 retries in " in str(info.value)
    assert str(info.value).startswith("read 'b': ConnectionRefusedError (gave up after")
    assert SECRET not in str(info.value)


def test_a_retry_count_of_one_and_no_budget_fails_fast() -> None:
    env = {"AZUREML_DATASET_HTTP_RETRY_COUNT": "1", "DATAMOUNT_RETRY_MIN_SECONDS": "0"}
    policy = RetryPolicy.from_settings(Settings.from_env(env))
    assert (policy.retries, policy.min_seconds) == (1, 0.0)
    delays: list[float] = []
    policy._sleep = delays.append  # no real wait in a unit test
    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        down()

    with pytest.raises(StorageError, match=r"gave up after 1 retries in "):
        policy.call(fn)
    assert len(calls) == 2 and len(delays) == 1


def test_the_settings_default_is_the_stores_default() -> None:
    policy = RetryPolicy.from_settings(Settings.from_env({}))
    assert (policy.retries, policy.min_seconds) == (7, DEFAULT_MIN_SECONDS) == (7, 90.0)
    env = {"AZUREML_DATASET_HTTP_RETRY_COUNT": "3", "DATAMOUNT_RETRY_MIN_SECONDS": "12.5"}
    assert repr(RetryPolicy.from_settings(Settings.from_env(env))) == (
        "RetryPolicy(retries=3, base_delay=0.2, max_delay=30.0, min_seconds=12.5)"
    )
    with pytest.raises(ValueError, match="min_seconds must be >= 0"):
        RetryPolicy(min_seconds=-1.0)


class Storage:
    """A service that refuses every request until `up` is set; counts the
    failures of each caller."""

    def __init__(self) -> None:
        self.up = threading.Event()
        self.failures: dict[str, int] = {}
        self.lock = threading.Lock()

    def read(self, who: str) -> str:
        if not self.up.is_set():
            with self.lock:
                self.failures[who] = self.failures.get(who, 0) + 1
            down()
        return f"data of {who}"


def retry_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "datamount.retry" and r.levelno >= logging.WARNING
    ]


def test_one_outage_of_many_callers_is_two_warning_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    storage = Storage()
    # waits of at most 1 ms (the default, wakeable wait): far from the 60 s budget
    policy = RetryPolicy(base_delay=1e-4, max_delay=1e-3, min_seconds=60.0)
    results: dict[str, str] = {}
    names = [f"w{i}" for i in range(4)]

    def worker(who: str) -> None:
        results[who] = policy.call(storage.read, who, description=f"read {who!r}")

    with caplog.at_level(logging.DEBUG, logger="datamount.retry"):
        threads = [threading.Thread(target=worker, args=(n,)) for n in names]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            len(storage.failures) == 4 and min(storage.failures.values()) >= 3
        ):
            time.sleep(0.005)
        storage.up.set()
        for t in threads:
            t.join(30)
    assert results == {n: f"data of {n}" for n in names}
    lines = retry_lines(caplog)
    assert len(lines) == 2, lines
    start, end = lines
    assert re.match(r"storage unreachable since \d\d:\d\d:\d\d: ", start)
    assert start.endswith(": ConnectionRefusedError; retrying for up to 60 s")
    assert end.startswith("storage reachable again after ")
    assert end.endswith(" s (4 requests retried)")
    assert all(SECRET not in line for line in lines)
    assert policy.stats.outages == 1 and policy.stats.exhausted == 0
    assert policy.stats.retries == sum(storage.failures.values())
    assert policy.outage.failing == 0


def test_a_single_blip_retried_once_is_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    failed: list[int] = []

    def once() -> str:
        if not failed:
            failed.append(1)
            down()
        return "ok"

    policy = RetryPolicy(sleep=lambda _s: None, min_seconds=60.0)
    with caplog.at_level(logging.DEBUG, logger="datamount.retry"):
        assert policy.call(once) == "ok"
    assert retry_lines(caplog) == []
    assert policy.stats.retries == 1 and policy.stats.outages == 0


def test_giving_up_ends_the_outage_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    policy = RetryPolicy(retries=2, sleep=sleep, min_seconds=5.0, clock=lambda: now[0])
    gave_up = pytest.raises(StorageError, match=r"gave up after \d+ retries in 5\.0 s")
    with caplog.at_level(logging.WARNING, logger="datamount.retry"), gave_up:
        policy.call(down, description="read 'b'")
    assert retry_lines(caplog)[1:] == [
        "storage still unreachable after 5.0 s: gave up (1 request retried)"
    ]
    assert policy.stats.exhausted == 1 and policy.outage.failing == 0


def test_an_answer_to_one_caller_wakes_the_others_from_their_backoff() -> None:
    """A waits in a backoff of at least 50 s; another caller's retry gets an
    answer: the outage is over and A retries at once instead of sleeping it out."""
    storage = Storage()
    policy = RetryPolicy(base_delay=100.0, max_delay=100.0, min_seconds=60.0)
    done: dict[str, str] = {}
    a = threading.Thread(target=lambda: done.update(a=policy.call(storage.read, "a")))
    a.start()
    deadline = time.monotonic() + 10
    while policy.outage.failing < 1 and time.monotonic() < deadline:  # A is in its backoff
        time.sleep(0.01)
    storage.up.set()
    policy.outage.failed(ConnectionResetError(), 0)  # B failed, was retried ...
    policy.outage.leave(answered=True)  # ... and got its answer
    a.join(20)
    alive = a.is_alive()
    if alive:  # let the thread end before failing: end another outage
        policy.outage.failed(ConnectionResetError(), 0)
        policy.outage.leave(answered=True)
        a.join()
    assert not alive, "A slept out its backoff"
    assert done == {"a": "data of a"}
    assert storage.failures == {"a": 1}
    assert policy.outage.generation == 1 and policy.outage.failing == 0


def test_a_throttled_caller_is_not_woken_early() -> None:
    """After a 503 the server asked for room: an answer to another caller
    does not cut that backoff short."""
    from faults import throttled

    policy = RetryPolicy(base_delay=0.6, max_delay=0.6, min_seconds=0.0)
    calls: list[float] = []

    def busy_once() -> str:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise throttled()()
        return "ok"

    t = threading.Thread(target=lambda: policy.call(busy_once))
    t.start()
    deadline = time.monotonic() + 10
    while policy.outage.failing < 1 and time.monotonic() < deadline:  # in its backoff
        time.sleep(0.01)
    policy.outage.failed(ConnectionResetError(), 0)
    policy.outage.leave(answered=True)  # another caller got its answer
    t.join(10)
    assert len(calls) == 2
    assert calls[1] - calls[0] >= 0.3  # equal jitter: at least half of the 0.6 s cap


def test_a_worker_process_opens_its_store_with_the_same_budget() -> None:
    """The lanes' worker processes rebuild the policy from the store's recipe."""
    from datamount.storage.azure_blob import AzureBlobStore
    from datamount.storage.credentials import Credential
    from datamount.storage.http import HttpStore

    policy = RetryPolicy(retries=3, base_delay=0.5, max_delay=9.0, min_seconds=12.0)
    endpoint = "http://127.0.0.1:9/devstoreaccount1"  # never asked: nothing is read
    store = AzureBlobStore(endpoint, "c", Credential.account_key("a2V5"), account="acct",
                           retry=policy)  # fmt: skip
    recipe = store.recipe()
    assert recipe is not None and recipe.retry == (3, 0.5, 9.0, 12.0)
    twin = recipe.open()
    assert repr(twin.retry) == repr(policy)
    assert twin.retry is not policy  # its own outage and counters, in its own process
    # a store opened without a policy (the Python API) gets the settings' default budget
    bare = AzureBlobStore(endpoint, "c2")
    site = HttpStore("http://127.0.0.1:9")
    assert bare.retry.min_seconds == site.retry.min_seconds == DEFAULT_MIN_SECONDS
    for s in (twin, store, bare, site):
        s.close()


def test_a_mounts_outages_are_a_metric() -> None:
    from datamount.metrics import MountCollector

    collector = MountCollector(lambda: {"cache": {"outages": 3, "retries": 40}}, None)
    values = {m.name: m.samples[0].value for m in collector.collect() if m.samples}
    assert values["datamount_storage_outages"] == 3
    assert values["datamount_storage_retries"] == 40


def test_the_copies_behind_a_replica_store_fail_over_after_the_count() -> None:
    """A replica set rides out an outage of one copy by failing over, not by
    waiting: each copy's policy has no budget, the counters are the input's."""
    from datamount.storage import store_for
    from datamount.storage.location import StorageKind, StorageLocation
    from datamount.storage.replicas import ReplicaStore

    a = StorageLocation(StorageKind.HTTP, "http://127.0.0.1:9/a/f.bin")
    b = StorageLocation(StorageKind.HTTP, "http://127.0.0.1:8/b/f.bin")
    policy = RetryPolicy.from_settings(Settings.from_env({}))
    store = store_for(Settings.from_env({}), dataclasses.replace(a, replicas=(a, b)), policy)
    assert isinstance(store, ReplicaStore)
    inner = [r.store.retry for r in store.replicas]  # type: ignore[attr-defined]
    assert [(p.retries, p.min_seconds) for p in inner] == [(7, 0.0), (7, 0.0)]
    assert all(p.stats is policy.stats for p in inner)
    store.close()
    single = store_for(Settings.from_env({}), a, policy)
    assert single.retry is policy  # type: ignore[attr-defined]
    single.close()
