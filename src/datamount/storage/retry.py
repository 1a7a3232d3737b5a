"""The one retry policy of storage requests: exponential backoff with equal
jitter under a time budget, Retry-After honoured, transient versus permanent
decided by the error, and one WARNING line when an outage starts and one when
it ends.

Every storage request of every store (and so of the downloader, uploader and
mount) goes through `RetryPolicy.call`; the SDKs' own retries are disabled so
attempts never multiply. The policy is a value built once by the composition
root from settings (AZUREML_DATASET_HTTP_RETRY_COUNT,
DATAMOUNT_RETRY_MIN_SECONDS: `RetryPolicy.from_settings`); it never reads the
environment.

A transient failure is repeated until both the retry count is spent and the
time budget has passed, so an outage of up to `min_seconds` is ridden out
whatever the jitter picked. The outage is the policy's, not a request's: many
workers share one policy, the first of them that gets an answer again ends it
and wakes the others from their backoff (unless they wait on a throttle).

Threads: one policy is shared by every worker thread; `call` keeps its own
attempt state on its stack, the outage state and `RetryStats` sit under locks.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from datamount.errors import StorageError, Throttled

if TYPE_CHECKING:
    from datamount.settings import Settings

T = TypeVar("T")

log = logging.getLogger("datamount.retry")

THROTTLE_STATUSES = frozenset({429, 503})
# A server asking for more than a minute is treated as asking for a minute: the
# next attempt then gets its own answer, and a job is never parked for an hour
# on one bad header.
MAX_RETRY_AFTER = 60.0
# Why 90 s: docs/storage.md ("Retries"): the Azure Storage SDK's ExponentialRetry
# waits 18, 24 and 42 s (84 s, 75-93 s with its jitter) before it gives up.
DEFAULT_MIN_SECONDS = 90.0


@dataclass
class RetryStats:
    """Thread-safe counters, read by tests, benchmarks and the status command."""

    retries: int = 0  # attempts repeated after a transient error
    throttled: int = 0  # of those, after a 429 / 503
    exhausted: int = 0  # calls that spent every retry and raised
    outages: int = 0  # outages announced (a request failed twice in a row)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(
        self, *, retries: int = 0, throttled: int = 0, exhausted: int = 0, outages: int = 0
    ) -> None:
        with self._lock:
            self.retries += retries
            self.throttled += throttled
            self.exhausted += exhausted
            self.outages += outages


def is_transient(exc: BaseException) -> bool:
    """True when repeating the request may succeed.

    Stores translate service errors into StorageError with `.transient` set by
    the one table in `storage.errormap`; builtin connection errors and timeouts
    that escape a store unmapped are transient too. Everything else (local
    OSErrors such as ENOSPC, programming errors) is not.
    """
    if isinstance(exc, StorageError):
        return exc.transient
    return isinstance(exc, ConnectionError | TimeoutError)


@dataclass
class _Attempts:
    """One call's retry state (on the calling thread's stack)."""

    started: float = 0.0  # the policy's clock at the first failure
    attempt: int = 0  # repeats made so far
    waited: float = 0.0  # seconds spent in backoff


class RetryPolicy:
    """Repeat a storage call on transient errors.

    `retries` is the least number of *repeats*; `min_seconds` the least time
    from a call's first failure to its giving up (0: the count alone decides,
    so `retries=0, min_seconds=0` fails at the first error). The call gives up
    once both are reached. The delay before repeat n (0-based) is uniform in
    [cap/2, cap] with cap = min(max_delay, base_delay * 2**n) ("equal jitter":
    concurrent clients that failed together do not retry together, and a
    delay is never near zero), cut to what is left of the budget once the
    count is spent, and raised to the server's Retry-After when it gave one
    (capped at `max_retry_after`).

    `sleep` and `clock` are for tests; with the default sleep a backoff ends
    early when another call through this policy recovers from the outage.
    """

    def __init__(
        self,
        retries: int = 7,
        base_delay: float = 0.2,
        max_delay: float = 30.0,
        sleep: Callable[[float], None] | None = None,
        rng: random.Random | None = None,
        *,
        min_seconds: float = 0.0,
        max_retry_after: float = MAX_RETRY_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        if min_seconds < 0:
            raise ValueError("min_seconds must be >= 0")
        self.retries = retries
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.min_seconds = min_seconds
        self.max_retry_after = max_retry_after
        self._sleep = sleep
        self.clock = clock
        self._rng = rng if rng is not None else random.Random()
        self.stats = RetryStats()
        self.outage = Outage(self)

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        """The policy of a command or a daemon: AZUREML_DATASET_HTTP_RETRY_COUNT
        repeats and DATAMOUNT_RETRY_MIN_SECONDS, whichever is later."""
        return cls(retries=settings.http_retry_count, min_seconds=settings.retry_min_seconds)

    def without_budget(self) -> RetryPolicy:
        """This policy giving up after its count alone, its counters shared:
        for the stores behind a ReplicaStore, which fails over to another
        copy rather than wait out an outage of one."""
        twin = RetryPolicy(
            self.retries, self.base_delay, self.max_delay, self._sleep, self._rng,
            max_retry_after=self.max_retry_after, clock=self.clock,
        )  # fmt: skip
        twin.stats = self.stats
        return twin

    def __repr__(self) -> str:
        return (
            f"RetryPolicy(retries={self.retries}, base_delay={self.base_delay}, "
            f"max_delay={self.max_delay}, min_seconds={self.min_seconds})"
        )

    def backoff(self, attempt: int, retry_after: float | None = None) -> float:
        """The delay in seconds before repeat number `attempt` (0-based)."""
        cap = min(self.max_delay, self.base_delay * (2.0 ** min(attempt, 62)))
        delay = self._rng.uniform(cap / 2.0, cap)
        if retry_after is not None and retry_after > 0:
            delay = max(delay, min(retry_after, self.max_retry_after))
        return delay

    def call(self, fn: Callable[..., T], *args: Any, description: str = "", **kwargs: Any) -> T:
        """Return `fn(*args, **kwargs)`, repeating it on transient errors.

        Permanent errors are raised at once, unchanged. When every retry is
        spent and the budget has passed, the last error is raised as a final
        (non-transient) error: `Throttled` (EAGAIN) after a 429/503, else a
        StorageError with the last error's errno (EIO for 5xx and connection
        resets).
        """
        state = _Attempts()
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if not is_transient(exc):
                    if state.attempt:
                        self.outage.leave(answered=isinstance(exc, StorageError))
                    raise
                self._after_failure(exc, state, description or getattr(fn, "__name__", ""))
            else:
                if state.attempt:
                    self.outage.leave(answered=True)
                return result

    def _after_failure(self, exc: Exception, state: _Attempts, what: str) -> None:
        """Wait before the next attempt, or raise the final error."""
        now = self.clock()
        if state.attempt == 0:
            state.started = now
        generation = self.outage.failed(exc, state.attempt)
        elapsed = max(state.waited, now - state.started)
        # (a microsecond's grace: waits that add up to the budget in floats)
        if state.attempt >= self.retries and elapsed >= self.min_seconds - 1e-6:
            self.stats.add(exhausted=1)
            self.outage.leave(answered=False)
            raise _final(exc, state.attempt, what, elapsed) from exc
        retry_after = exc.retry_after if isinstance(exc, StorageError) else None
        delay = self.backoff(state.attempt, retry_after)
        if state.attempt >= self.retries and not retry_after:
            # The count is spent: the last wait fills the budget, no more.
            delay = min(delay, self.min_seconds - elapsed)
        throttled = _status(exc) in THROTTLE_STATUSES
        self.stats.add(retries=1, throttled=int(throttled))
        state.attempt += 1
        # The message of a StorageError is built by storage.errormap from
        # status, error code and blob name: it never holds a secret. Other
        # exceptions are named by type only (their text may hold a URL with a
        # SAS).
        log.log(
            logging.INFO if state.attempt > 1 else logging.DEBUG,
            "retry %d of %s in %.2fs after %s",
            state.attempt,
            what or "request",
            delay,
            _describe(exc),
        )
        wake = None if throttled or retry_after else generation
        state.waited += self._wait(delay, wake)

    def _wait(self, delay: float, generation: int | None) -> float:
        """Sleep `delay` seconds, or less when the outage of `generation` ends;
        the seconds waited."""
        if self._sleep is not None:
            self._sleep(delay)
            return delay
        start = time.monotonic()
        if generation is None:
            time.sleep(delay)
        else:
            self.outage.wait_recovery(generation, start + delay)
        return time.monotonic() - start


class Outage:
    """The outage of one policy: from the first transient failure of any call
    while no outage is open, to the first answer to a call that was retried.

    It is announced (one WARNING line) when some call fails a second time in a
    row, so a single blip retried once stays a DEBUG line; its end is a WARNING
    line only when its start was. `generation` counts ended outages: a backoff
    started in one ends when it does."""

    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self._cond = threading.Condition()
        self.generation = 0
        self.failing = 0  # calls between their first failure and their end
        self._since: float | None = None  # the policy's clock at the start
        self._wall = 0.0
        self._retried = 0  # calls retried in this outage
        self._announced = False

    def failed(self, exc: Exception, attempt: int) -> int:
        """Count a transient failure of a call (its `attempt`-th repeat
        failed); the generation its backoff belongs to."""
        policy = self._policy
        with self._cond:
            if attempt == 0:
                self.failing += 1
            opened = self._since is None
            if opened:
                self._since, self._wall = policy.clock(), time.time()
                self._retried, self._announced = 0, False
            if attempt == 0 or opened:
                self._retried += 1
            if attempt >= 1 and not self._announced:
                self._announced = True
                policy.stats.add(outages=1)
                budget = (
                    f"retrying for up to {policy.min_seconds:g} s"
                    if policy.min_seconds
                    else f"retrying up to {policy.retries} times"
                )
                log.warning(
                    "storage unreachable since %s: %s; %s",
                    time.strftime("%H:%M:%S", time.gmtime(self._wall)),  # UTC, as the log
                    _describe(exc),
                    budget,
                )
            return self.generation

    def leave(self, *, answered: bool) -> None:
        """A retried call ended: `answered` by storage (a success or a
        permanent error: storage is reachable again), or it gave up."""
        with self._cond:
            self.failing = max(0, self.failing - 1)
            if self._since is None:
                return
            seconds = self._policy.clock() - self._since
            if answered:
                if self._announced:
                    log.warning(
                        "storage reachable again after %.1f s (%s retried)",
                        seconds,
                        _requests(self._retried),
                    )
                self._end()
            elif self.failing == 0:
                if self._announced:
                    log.warning(
                        "storage still unreachable after %.1f s: gave up (%s retried)",
                        seconds,
                        _requests(self._retried),
                    )
                self._end()

    def _end(self) -> None:
        self._since = None
        self.generation += 1
        self._cond.notify_all()

    def wait_recovery(self, generation: int, deadline: float) -> None:
        """Block until `deadline` (time.monotonic) or the end of outage `generation`."""
        with self._cond:
            while self.generation == generation:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._cond.wait(remaining)


def _requests(n: int) -> str:
    return f"{n} request" if n == 1 else f"{n} requests"


def _status(exc: BaseException) -> int | None:
    return exc.status if isinstance(exc, StorageError) else None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, StorageError):
        return str(exc)
    return type(exc).__name__


def _final(exc: Exception, retries: int, description: str, elapsed: float) -> StorageError:
    """The error raised once retries are spent: final, so no outer layer repeats it."""
    what = f"{description}: " if description else ""
    base = str(exc) if isinstance(exc, StorageError) else f"{what}{_describe(exc)}"
    message = f"{base} (gave up after {retries} retries in {elapsed:.1f} s)"
    status = _status(exc)
    if isinstance(exc, Throttled) or status in THROTTLE_STATUSES:
        return Throttled(message, status=status, exhausted=True)
    if isinstance(exc, StorageError):
        return type(exc)(message, status=status, err=exc.errno, exhausted=True)
    return StorageError(message, exhausted=True)
