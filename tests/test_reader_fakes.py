"""Fakes shared by the block-mode tests (no tests here): a dict-backed
BlockCache, a store whose reads wait at gates, a block-mode stack builder,
and a polling wait."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from datamount.read.blocks import BlockKey, ObjectId
from datamount.read.cache.protocol import BlockCache, NoCache
from datamount.read.fetch import BlockFetcher
from datamount.read.prefetch.scheduler import Scheduler
from datamount.read.reader import BlockReader
from datamount.read.stats import MountStats
from datamount.storage.base import ObjectStore
from datamount.storage.memory import MemoryStore

STORE = "memory://test"


def source(n: int, seed: int = 7) -> bytes:
    return random.Random(seed * 1_000_003 + n).randbytes(n)


def object_id(store: ObjectStore, key: str) -> ObjectId:
    info = store.stat(key)
    return ObjectId(STORE, key, info.etag, info.size)


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.002)


class DictCache:
    """A BlockCache in a dict: no bound, counts hits, puts and lookups."""

    def __init__(self) -> None:
        self.blocks: dict[BlockKey, bytes] = {}
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def get(self, key: BlockKey) -> bytes | None:
        with self._lock:
            data = self.blocks.get(key)
            self.counts["hit" if data is not None else "miss"] += 1
            return data

    def put(self, key: BlockKey, data: bytes) -> None:
        with self._lock:
            self.counts["put"] += 1
            self.blocks[key] = data

    def contains(self, key: BlockKey) -> bool:
        with self._lock:
            self.counts["contains"] += 1
            return key in self.blocks

    def close(self) -> None:
        return None


class GatedStore(MemoryStore):
    """A MemoryStore whose `read_into` waits while its (key, offset) is gated.

    `started` lists every read as it begins, so a test knows a worker is
    inside a request before it acts."""

    def __init__(self, objects: dict[str, bytes] | None = None) -> None:
        super().__init__(objects)
        self.gates: dict[tuple[str, int], threading.Event] = {}
        self.gate_all: threading.Event | None = None
        self.started: list[tuple[str, int]] = []
        self.spans: list[tuple[str, int, int]] = []  # (key, offset, length) of each read
        self._started_lock = threading.Lock()

    def gate(self, key: str, offset: int) -> threading.Event:
        return self.gates.setdefault((key, offset), threading.Event())

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        with self._started_lock:
            self.started.append((key, offset))
            self.spans.append((key, offset, len(buffer)))
        gate = self.gates.get((key, offset)) or self.gate_all
        if gate is not None and not gate.wait(30):
            raise TimeoutError(f"gate of {key}@{offset} never opened")
        return super().read_into(key, offset, buffer, etag=etag)

    def open_all(self) -> None:
        for gate in self.gates.values():
            gate.set()
        if self.gate_all is not None:
            self.gate_all.set()


@dataclass
class Stack:
    store: ObjectStore
    scheduler: Scheduler
    fetcher: BlockFetcher
    reader: BlockReader
    stats: MountStats
    block_size: int


@contextlib.contextmanager
def block_stack(
    store: ObjectStore,
    *,
    block_size: int = 1024,
    threads: int = 4,
    window: int = 8,
    budget: int | None = None,
    cache: BlockCache | None = None,
    run_blocks: int = 1,
) -> Iterator[Stack]:
    """`run_blocks`: blocks per prefetch request (1: one request per block,
    the simplest to count; the mount's default is 4)."""
    stats = MountStats()
    scheduler = Scheduler(threads)
    fetcher = BlockFetcher(
        store,
        cache if cache is not None else NoCache(),
        block_size,
        scheduler,
        stats,
        memory_budget=budget if budget is not None else 4 * window * block_size,
        run_bytes=run_blocks * block_size,
    )
    reader = BlockReader(fetcher, block_size, window)
    try:
        yield Stack(store, scheduler, fetcher, reader, stats, block_size)
    finally:
        if isinstance(store, GatedStore):
            store.open_all()
        reader.close()
        scheduler.close()
