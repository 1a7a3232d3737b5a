"""ReplicaStore logic over in-memory stores: striping, failover, the version check."""

from __future__ import annotations

import pytest

from datamount.errors import AccessDenied
from datamount.storage.memory import MemoryStore
from datamount.storage.replicas import Replica, ReplicaMismatch, ReplicaStore
from datamount.storage.retry import RetryPolicy
from faults import FaultyStore, forbidden, throttled

pytestmark = pytest.mark.unit

FILES = {f"f{i:02d}.bin": bytes([i]) * (100 + i) for i in range(12)}


def _memory(root: str, files: dict[str, bytes] = FILES) -> MemoryStore:
    store = MemoryStore()
    for name, data in files.items():
        store.put(root + name, data)
    store.requests.clear()
    return store


def _faulty(inner: MemoryStore) -> FaultyStore:
    return FaultyStore(inner, retry=RetryPolicy(retries=2, sleep=lambda _: None))


def _replicas(preferred: int = 0, files_b: dict[str, bytes] = FILES, **kw: float):
    a, b = _faulty(_memory("data/")), _faulty(_memory("copy/v1/", files_b))
    store = ReplicaStore(
        [Replica(a, "data/", "A"), Replica(b, "copy/v1/", "B")], preferred=preferred, **kw
    )
    return store, a, b


def _listing(store: ReplicaStore, prefix: str = "data/") -> list:
    return [o for page in store.list_pages(prefix) for o in page.objects]


def _read_all(store: ReplicaStore) -> dict[str, bytes]:
    return {o.key[5:]: store.read(o.key, 0, o.size, etag=o.etag) for o in _listing(store)}


@pytest.mark.parametrize("preferred", [0, 1])
def test_reads_only_the_preferred_replica_with_the_keys_of_the_first(preferred: int) -> None:
    store, a, b = _replicas(preferred)
    assert _read_all(store) == FILES
    used, idle = (a, b) if preferred == 0 else (b, a)
    assert used.attempts["read"] == len(FILES) and used.attempts["list"] >= 1
    assert sum(idle.attempts.values()) == 0
    assert store.stat("data/f03.bin").size == 103


def test_sustained_throttling_fails_over_with_the_same_bytes() -> None:
    store, a, b = _replicas(0)
    listed = _listing(store)
    a.plan.fail("read", times=None, error=throttled(status=503))
    got = {o.key: store.read(o.key, 10, 50, etag=o.etag) for o in listed}
    assert got == {"data/" + k: v[10:60] for k, v in FILES.items()}
    assert store.failovers == 1  # down once: the others go straight to B
    assert b.attempts["stat"] == len(FILES)  # each file checked once before reading there
    # the check is remembered: a second read of a file costs no stat
    store.read(listed[0].key, 0, 5, etag=listed[0].etag)
    assert b.attempts["stat"] == len(FILES)


def test_an_unreachable_replica_fails_over_for_listings_half_way() -> None:
    a_inner = _memory("data/")
    a_inner.page_size = 5
    a = _faulty(a_inner)
    b = _faulty(_memory("copy/v1/"))
    store = ReplicaStore([Replica(a, "data/", "A"), Replica(b, "copy/v1/", "B")])
    pages = store.list_pages("data/")
    first = next(pages)
    a.plan.fail("list", times=None, error=lambda: ConnectionResetError(104, "reset"))
    rest = [o for page in pages for o in page.objects]
    keys = [o.key for o in first.objects + rest]
    assert keys == sorted("data/" + k for k in FILES)  # none twice, none missing


def test_different_content_is_refused_never_mixed() -> None:
    other = dict(FILES, **{"f04.bin": b"\xff" * 104})  # same size, other bytes
    store, a, _ = _replicas(0, files_b=other)
    info = store.stat("data/f04.bin")
    assert store.read(info.key, 0, 4, etag=info.etag) == b"\x04" * 4
    a.plan.fail("read", times=None, error=throttled(status=429))
    with pytest.raises(ReplicaMismatch, match="different Content-MD5"):
        store.read(info.key, 4, 4, etag=info.etag)


def test_a_different_size_is_refused() -> None:
    store, a, _ = _replicas(0, files_b=dict(FILES, **{"f01.bin": b"x"}))
    info = store.stat("data/f01.bin")
    a.plan.fail("read", times=None, error=throttled())
    with pytest.raises(ReplicaMismatch, match="holds 1 bytes"):
        store.read(info.key, 0, 4, etag=info.etag)


def test_without_content_md5_a_failover_is_refused() -> None:
    a_inner, b_inner = MemoryStore(), MemoryStore()
    a_inner.commit_blocks("data/x", [])  # committed without Content-MD5, like a block upload
    b_inner.commit_blocks("copy/x", [])
    a, b = _faulty(a_inner), _faulty(b_inner)
    store = ReplicaStore([Replica(a, "data/", "A"), Replica(b, "copy/", "B")])
    info = store.stat("data/x")
    a.plan.fail("read", times=None, error=throttled())
    with pytest.raises(ReplicaMismatch, match="Content-MD5 is missing"):
        store.read("data/x", 0, 1, etag=info.etag)


def test_permanent_errors_do_not_fail_over() -> None:
    store, a, b = _replicas(0)
    info = store.stat("data/f00.bin")
    a.plan.fail("read", times=None, error=forbidden())
    with pytest.raises(AccessDenied):
        store.read(info.key, 0, 1, etag=info.etag)
    assert b.attempts["read"] == 0


def test_a_failed_replica_is_tried_again_after_the_cooldown() -> None:
    now = [0.0]
    store, a, b = _replicas(0, cooldown=30.0, clock=lambda: now[0])
    a.plan.fail("stat", times=3, error=throttled())  # 1 try + 2 retries
    store.stat("data/f00.bin")
    assert store.order() == [1, 0]
    now[0] = 31.0
    assert store.order() == [0, 1]
    store.stat("data/f00.bin")
    assert a.attempts["stat"] == 4


def test_a_file_entry_maps_to_the_file_in_each_replica() -> None:
    a, b = _faulty(_memory("data/")), _faulty(_memory("copy/"))
    store = ReplicaStore(
        [Replica(a, "data/f02.bin", "A"), Replica(b, "copy/f02.bin", "B")], preferred=1
    )
    info = store.stat("data/f02.bin")
    assert info.key == "data/f02.bin" and info.etag.startswith("r1:")
    assert store.read(info.key, 0, 200, etag=info.etag) == FILES["f02.bin"]
    assert a.attempts["read"] == 0
