"""One memory budget per mount: the bytes held in RAM outside the RAM tier.

mountpoint-s3's mem_limiter.rs, ours (docs/design/memory.md): named areas,
each with its own limit, and a total that is the sum of the limits:

- PREFETCH: the BlockFetcher's prefetches in flight, prefetched blocks not
  yet read and recently read blocks (READ_BUFFER_BLOCK_COUNT x BLOCK_SIZE).
- DEMAND: blocks a reader waits for. Limit 0: `reserve` never fails and
  never waits, even past the total (a demand read must never deadlock
  behind prefetch); while demand is over, background work waits.
- DISK_QUEUE: blocks waiting for the disk tier's writers.
- UPLOAD: the rw_mount upload buffers (2 x upload threads x 8 MiB blocks).

Invariant: `try_reserve` (prefetch, the disk queue: rather skip than wait)
and `acquire` (an upload: waits) succeed only when the area stays within its
limit and the whole budget within its total. The RAM tier is apart.

In a container the budget must also fit the cgroup's memory limit
(`cgroup_memory_limit`: memory.max under cgroup v2, memory.limit_in_bytes
under v1, the tightest of the process's cgroup and its ancestors):
`fit_limits` scales every area down, each keeping at least its floor (one
block), so that budget + RAM tier + interpreter headroom stay under it.

Threads: any thread; one Condition guards the counts. It calls nothing
outside itself, so a caller may hold its own lock while calling in.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

PREFETCH = "prefetch"
DEMAND = "demand"
DISK_QUEUE = "disk queue"
UPLOAD = "upload"

_LABELS = {
    PREFETCH: "prefetch and held blocks",
    DEMAND: "demand reads",
    DISK_QUEUE: "disk-write queue",
    UPLOAD: "upload buffers",
}


class MemoryBudget:
    def __init__(self, limits: Mapping[str, int]) -> None:
        """`limits`: bytes per area; the total is their sum. An area with
        limit 0 is served only by `reserve` (demand)."""
        if any(limit < 0 for limit in limits.values()):
            raise ValueError(f"memory budget limits must not be negative: {dict(limits)}")
        self.limits = dict(limits)
        self.total = sum(self.limits.values())
        self._cond = threading.Condition(threading.Lock())
        self._used = dict.fromkeys(self.limits, 0)
        self._in_use = 0
        self._peak = 0

    def limit(self, area: str) -> int:
        return self.limits[area]

    def has(self, area: str) -> bool:
        return area in self.limits

    # -- taking and giving back ----------------------------------------------

    def try_reserve(self, area: str, size: int) -> bool:
        """Take `size` bytes for `area` if it stays within its limit and the
        budget within its total; never waits."""
        with self._cond:
            if not self._fits(area, size):
                return False
            self._take(area, size)
            return True

    def reserve(self, area: str, size: int) -> None:
        """Take `size` bytes for `area` whatever the limits (demand reads):
        never fails, never waits."""
        with self._cond:
            self._used[area]  # KeyError for an area the budget does not have
            self._take(area, size)

    def acquire(self, area: str, size: int, timeout: float | None = None) -> bool:
        """Take `size` bytes for `area`, waiting until they fit; False on
        timeout. ValueError when they can never fit (more than the area's
        limit)."""
        if size > self.limits[area]:
            raise ValueError(
                f"{size} bytes can never fit the {area!r} area of the memory budget "
                f"({self.limits[area]} bytes)"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._fits(area, size):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            self._take(area, size)
            return True

    def release(self, area: str, size: int) -> None:
        """Give back `size` bytes `area` took."""
        if size == 0:
            return
        with self._cond:
            if size < 0 or size > self._used[area]:
                raise ValueError(
                    f"releasing {size} bytes of the {area!r} area, which holds {self._used[area]}"
                )
            self._used[area] -= size
            self._in_use -= size
            self._cond.notify_all()

    @contextlib.contextmanager
    def held(self, area: str, size: int) -> Iterator[None]:
        """`acquire` for the duration of a block; released however it ends."""
        self.acquire(area, size)
        try:
            yield
        finally:
            self.release(area, size)

    # -- looking -------------------------------------------------------------

    def in_use(self, area: str | None = None) -> int:
        with self._cond:
            return self._in_use if area is None else self._used[area]

    @property
    def peak(self) -> int:
        """The most bytes held at once since the budget was made."""
        with self._cond:
            return self._peak

    def describe(self) -> str:
        """One line for the start-up log: the total and what draws from it."""
        parts = [
            f"{_LABELS.get(area, area)} {_mib(limit)}"
            for area, limit in self.limits.items()
            if limit > 0
        ]
        line = f"{_mib(self.total)} ({', '.join(parts) or 'nothing'})"
        if DEMAND in self.limits:
            line += "; demand reads never wait for it"
        return line

    # -- lock held -----------------------------------------------------------

    def _fits(self, area: str, size: int) -> bool:
        if size < 0:
            raise ValueError(f"cannot take {size} bytes")
        return self._used[area] + size <= self.limits[area] and self._in_use + size <= self.total

    def _take(self, area: str, size: int) -> None:
        if size < 0:
            raise ValueError(f"cannot take {size} bytes")
        self._used[area] += size
        self._in_use += size
        self._peak = max(self._peak, self._in_use)


# -- the container's memory limit ----------------------------------------------------

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
# What the daemon holds outside the budget and the RAM tier: the interpreter,
# its modules, libfuse and the HTTP pools, twice over for the allocator's
# fragmentation. Why 128 MiB: docs/design/memory.md ("Interpreter headroom").
INTERPRETER_HEADROOM = 128 << 20
# cgroup v1 writes "no limit" as a page-rounded 2**63 - 1.
_V1_UNLIMITED = 1 << 60


def cgroup_memory_limit(
    root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP
) -> tuple[int, Path] | None:
    """The tightest memory limit of this process's cgroup and its ancestors,
    with the file that sets it; None when there is none (or no cgroup fs)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    found: list[tuple[int, Path]] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/"):
            continue
        if hierarchy == "0" and controllers == "":  # v2: the unified hierarchy
            base, name = root, "memory.max"
        elif "memory" in controllers.split(","):  # v1: the memory controller's own
            base, name = root / "memory", "memory.limit_in_bytes"
        else:
            continue
        folder = base / path.strip("/")
        while True:
            limit = _read_limit(folder / name)
            if limit is not None:
                found.append((limit, folder / name))
            if folder == base or base not in folder.parents:
                break
            folder = folder.parent
    return min(found, default=None, key=lambda item: item[0])


def _read_limit(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text in ("", "max"):
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value <= 0 or value >= _V1_UNLIMITED else value


def fit_limits(limits: Mapping[str, int], room: int, floors: Mapping[str, int]) -> dict[str, int]:
    """`limits` scaled down by one factor so their sum fits `room` bytes,
    each area kept at or above its floor (and areas at 0 left at 0); the
    limits as they are when they fit already."""
    total = sum(limits.values())
    if total <= room:
        return dict(limits)
    factor = max(0, room) / total if total else 0.0
    return {
        area: 0 if limit == 0 else max(min(limit, floors.get(area, 0)), int(limit * factor))
        for area, limit in limits.items()
    }


def _mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"
