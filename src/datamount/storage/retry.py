"""The one retry policy of storage requests: exponential backoff with full
jitter, Retry-After honoured, transient versus permanent decided by the error.

Every storage request of every store (and so of the downloader, uploader and
mount) goes through `RetryPolicy.call`; the SDKs' own retries are disabled so
attempts never multiply. The policy is a value built once by the composition
root from settings (AZUREML_DATASET_HTTP_RETRY_COUNT); it never reads the
environment.

Threads: one policy is shared by every worker thread; `call` keeps no
per-call state on the instance and `RetryStats` counts under a lock.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from datamount.errors import StorageError, Throttled

T = TypeVar("T")

log = logging.getLogger("datamount.retry")

THROTTLE_STATUSES = frozenset({429, 503})
# A server asking for more than a minute is treated as asking for a minute: the
# next attempt then gets its own answer, and a job is never parked for an hour
# on one bad header.
MAX_RETRY_AFTER = 60.0


@dataclass
class RetryStats:
    """Thread-safe counters, read by tests, benchmarks and the status command."""

    retries: int = 0  # attempts repeated after a transient error
    throttled: int = 0  # of those, after a 429 / 503
    exhausted: int = 0  # calls that spent every retry and raised
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, *, retries: int = 0, throttled: int = 0, exhausted: int = 0) -> None:
        with self._lock:
            self.retries += retries
            self.throttled += throttled
            self.exhausted += exhausted


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


class RetryPolicy:
    """Repeat a storage call on transient errors.

    `retries` is the number of *repeats* (so at most `retries + 1` attempts).
    The delay before repeat n (0-based) is uniform in
    [0, min(max_delay, base_delay * 2**n)] ("full jitter": concurrent clients
    that failed together do not retry together), raised to the server's
    Retry-After when it gave one (capped at `max_retry_after`).
    """

    def __init__(
        self,
        retries: int = 7,
        base_delay: float = 0.2,
        max_delay: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        *,
        max_retry_after: float = MAX_RETRY_AFTER,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.retries = retries
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.max_retry_after = max_retry_after
        self._sleep = sleep
        self._rng = rng if rng is not None else random.Random()
        self.stats = RetryStats()

    def __repr__(self) -> str:
        return (
            f"RetryPolicy(retries={self.retries}, base_delay={self.base_delay}, "
            f"max_delay={self.max_delay})"
        )

    def backoff(self, attempt: int, retry_after: float | None = None) -> float:
        """The delay in seconds before repeat number `attempt` (0-based)."""
        cap = min(self.max_delay, self.base_delay * (2.0 ** min(attempt, 62)))
        delay = self._rng.uniform(0.0, cap)
        if retry_after is not None and retry_after > 0:
            delay = max(delay, min(retry_after, self.max_retry_after))
        return delay

    def call(self, fn: Callable[..., T], *args: Any, description: str = "", **kwargs: Any) -> T:
        """Return `fn(*args, **kwargs)`, repeating it on transient errors.

        Permanent errors are raised at once, unchanged. When every retry is
        spent, the last error is raised as a final (non-transient) error:
        `Throttled` (EAGAIN) after a 429/503, else a StorageError with the
        last error's errno (EIO for 5xx and connection resets).
        """
        attempt = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if attempt >= self.retries:
                    self.stats.add(exhausted=1)
                    raise _final(exc, attempt, description) from exc
                retry_after = exc.retry_after if isinstance(exc, StorageError) else None
                delay = self.backoff(attempt, retry_after)
                throttled = _status(exc) in THROTTLE_STATUSES
                self.stats.add(retries=1, throttled=int(throttled))
                attempt += 1
                # The message of a StorageError is built by storage.errormap from
                # status, error code and blob name: it never holds a secret.
                # Other exceptions are named by type only (their text may hold
                # a URL with a SAS).
                log.log(
                    logging.INFO if attempt > 1 else logging.DEBUG,
                    "retry %d/%d of %s in %.2fs after %s",
                    attempt,
                    self.retries,
                    description or getattr(fn, "__name__", "request"),
                    delay,
                    _describe(exc),
                )
                self._sleep(delay)


def _status(exc: BaseException) -> int | None:
    return exc.status if isinstance(exc, StorageError) else None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, StorageError):
        return str(exc)
    return type(exc).__name__


def _final(exc: Exception, retries: int, description: str) -> StorageError:
    """The error raised once retries are spent: final, so no outer layer repeats it."""
    what = f"{description}: " if description else ""
    base = str(exc) if isinstance(exc, StorageError) else f"{what}{_describe(exc)}"
    message = f"{base} (gave up after {retries} retries)"
    status = _status(exc)
    if isinstance(exc, Throttled) or status in THROTTLE_STATUSES:
        return Throttled(message, status=status, exhausted=True)
    if isinstance(exc, StorageError):
        return type(exc)(message, status=status, err=exc.errno, exhausted=True)
    return StorageError(message, exhausted=True)
