"""How many requests to keep in flight on a link with latency: Little's law.

The thread defaults (RSLEX_DOWNLOADER_THREADS and DATASET_MOUNT_READ_THREADS,
cores x 4) keep a store close by busy: a request's time is mostly service
(the server's work, the transfer, our CPU). Over a link with a long round
trip each request also waits that round trip, and the requests in flight,
not the bandwidth, bound the rate: rate = in flight / time per request. To
keep the rate of a store close by, in flight must grow with the time per
request: `in_flight(base, rtt)` is base x (rtt + SERVICE_SECONDS) /
SERVICE_SECONDS, from RTT_FLOOR_SECONDS up (below it, the link is as good
as local), at most MAX_IN_FLIGHT (memory: every request holds a buffer,
connections and threads; a caller whose requests hold large buffers passes a
lower cap), never below `base`.

`probe(store, key)` measures the round trip on the store's warm connection:
the fastest of PROBES metadata requests of `key` (an answer of "not found"
is a round trip too; any other failure is raised, as the work would meet
it). The caller applies the result only where the user set no thread count;
docs/design/storage.md has the measurements behind the constants. No
threads, no state.
"""

from __future__ import annotations

import contextlib
import math
import time

from datamount.errors import ObjectNotFound
from datamount.storage.base import ObjectStore

# A request's own time on a store close by, and the round trip below which
# the defaults are kept (docs/design/storage.md, "Requests in flight").
SERVICE_SECONDS = 0.004
RTT_FLOOR_SECONDS = 0.003
MAX_IN_FLIGHT = 64
PROBES = 2
# What the probe stats when `key` is the container's root ("" is no blob name:
# HTTP 400): a name no blob has, answered "not found".
ROOT_PROBE = ".datamount-round-trip"


def probe(store: ObjectStore, key: str) -> float:
    """The store's round trip in seconds: the fastest of PROBES stats of `key`.
    A failure other than "not found" is raised: it is the one the work that
    follows would meet (a token that cannot be had, a refused credential)."""
    best, target = math.inf, key.rstrip("/") or ROOT_PROBE
    for _ in range(PROBES):
        start = time.perf_counter()
        with contextlib.suppress(ObjectNotFound):  # a folder's key: answered all the same
            store.stat(target)
        best = min(best, time.perf_counter() - start)
    return best


def in_flight(base: int, rtt: float, cap: int = MAX_IN_FLIGHT) -> int:
    """Requests to keep in flight over a round trip of `rtt` seconds, for a
    default of `base` on a store close by; at most `cap` (<= MAX_IN_FLIGHT)."""
    if rtt < RTT_FLOOR_SECONDS:
        return base
    wanted = math.ceil(base * (rtt + SERVICE_SECONDS) / SERVICE_SECONDS)
    return max(base, min(cap, MAX_IN_FLIGHT, wanted))
