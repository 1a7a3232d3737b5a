"""The mount's fetch lane in worker processes (DATAMOUNT_MOUNT_PROCESSES,
read/fetchlane.py) against real Azurite, through a FaultProxy that sees every
process's requests: bytes equal, one GET per file or run of blocks, the block
files the workers write are the disk tier's (indexed, verified when read back;
a block the disk has no room for is not written), errors keep their class, a
dead worker's files are read in the daemon, nothing is left behind, and the
account key reaches a worker over its pipe only; then a real ro_mount over
HTTPS with the knob set."""

from __future__ import annotations

import errno
import glob
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from azurite import Azurite
from conftest import seeded_stores
from datamount.errors import ObjectNotFound, SettingsError, VersionChanged
from datamount.read.blocks import BlockKey, ObjectId
from datamount.read.cache.disk import DiskCache
from datamount.read.cache.protocol import NoCache
from datamount.read.fetch import BlockFetcher, block_buffer
from datamount.read.fetchlane import LaneUnavailable, MountLane
from datamount.read.prefetch.scheduler import Scheduler
from datamount.read.stats import MountStats
from datamount.settings import Settings
from datamount.storage import ObjectStore
from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file

SLAB = 512 * 1024
rng = random.Random(17)
SIZES = [1, 777, 4095, 4096, 65_536, 300_001, SLAB]  # page-aligned and not, a whole slab


@pytest.fixture
def seeded(azurite, container, proxy) -> Iterator[Callable[[dict[str, bytes]], ObjectStore]]:  # noqa: ANN001
    yield from seeded_stores(azurite, container, proxy.endpoint, retries=1)


@pytest.fixture
def lanes() -> Iterator[Callable[..., MountLane]]:
    made: list[MountLane] = []

    def make(
        store: ObjectStore,
        disk: DiskCache | None = None,
        processes: int = 2,
        block_size: int = SLAB,
        run_blocks: int = 1,
    ) -> MountLane:
        recipe = store.recipe()  # type: ignore[attr-defined]
        lane = MountLane(recipe, processes, 2, block_size, disk, run_blocks=run_blocks)
        made.append(lane)
        return lane

    yield make
    for lane in made:
        lane.close()


def disk_cache(root: Path, limit: int = 1 << 30) -> DiskCache:
    return DiskCache(
        root,
        limit=lambda free, used: limit,
        prune_threshold=1.0,
        prune_target=0.7,
        write_threads=1,
        max_queue_bytes=16 << 20,
    )


def obj_of(store: ObjectStore, key: str) -> ObjectId:
    info = store.stat(key)
    return ObjectId("acct/container", key, info.etag, info.size)


def read(lane: MountLane, obj: ObjectId) -> bytes:
    buffer = block_buffer(obj.size)
    n = lane.read_into(obj, 0, [buffer])
    return bytes(buffer[:n])


def read_run(lane: MountLane, obj: ObjectId, first: int, count: int) -> bytes:
    """Blocks first.. first + count - 1 of `obj` in one lane call, one buffer each."""
    bs = lane.block_size
    buffers = [block_buffer(min(bs, obj.size - i * bs)) for i in range(first, first + count)]
    n = lane.read_into(obj, first * bs, buffers)
    return b"".join(bytes(b) for b in buffers)[:n]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_worker_processes_read_every_byte_one_get_per_file_and_write_its_block_file(
    seeded,
    proxy,
    lanes,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    blobs = {f"lane/f{i:02}.bin": rng.randbytes(SIZES[i % len(SIZES)]) for i in range(28)}
    store = seeded(blobs)
    disk = disk_cache(tmp_path / "blocks")
    lane = lanes(store, disk)
    assert len(lane.pids) == 2 and os.getpid() not in lane.pids
    assert not glob.glob("/dev/shm/datamount-lane-*")  # unlinked once the workers mapped it
    objs = {name: obj_of(store, name) for name in blobs}
    proxy.reset()
    with ThreadPoolExecutor(8) as pool:  # more callers than the 4 slabs: they wait their turn
        got = dict(zip(objs, pool.map(lambda o: read(lane, o), objs.values()), strict=True))
    assert got == blobs
    for name in blobs:
        assert len(proxy.ranged_gets(name)) == 1, name
    # The workers' block files are the disk tier's: indexed, read back and verified.
    assert disk.used_bytes == sum(p.stat().st_size for p in (tmp_path / "blocks").rglob("*.blk"))
    for name, obj in objs.items():
        assert disk.contains(BlockKey(obj, 0))
        assert disk.get(BlockKey(obj, 0)) == blobs[name]
    pids = lane.pids
    lane.close()
    assert not any(alive(pid) for pid in pids)


def test_runs_of_a_big_files_blocks_are_one_get_each_and_every_block_gets_its_file(
    seeded,
    proxy,
    lanes,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    bs = 64 * 1024
    data = rng.randbytes(7 * bs + 1234)  # 8 blocks, the last one short
    store = seeded({"big/b.bin": data})
    obj = obj_of(store, "big/b.bin")
    disk = disk_cache(tmp_path / "blocks")
    lane = lanes(store, disk, block_size=bs, run_blocks=3)
    assert lane.slab_size == 3 * bs and lane.takes(3 * bs) and not lane.takes(3 * bs + 1)
    proxy.reset()
    runs = [(0, 3), (3, 3), (6, 2)]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda r: read_run(lane, obj, *r), runs))
    assert got == [data[first * bs : (first + n) * bs] for first, n in runs]
    ranges = sorted(r.range or "" for r in proxy.ranged_gets("big/b.bin"))
    assert ranges == sorted(f"bytes={f * bs}-{min((f + n) * bs, len(data)) - 1}" for f, n in runs)
    files = sorted((tmp_path / "blocks").rglob("*.blk"))
    assert len(files) == 8 and disk.used_bytes == sum(p.stat().st_size for p in files)
    for i in range(8):
        assert disk.get(BlockKey(obj, i)) == data[i * bs : (i + 1) * bs]
    # A disk with room for two whole blocks: the third of the run is not written
    # (the fetcher's cache put queues it as usual), its room is given back.
    full = max(p.stat().st_size for p in files)
    small = disk_cache(tmp_path / "small", limit=2 * full + full // 2)
    lane2 = lanes(store, small, processes=1, block_size=bs, run_blocks=3)
    assert read_run(lane2, obj, 0, 3) == data[: 3 * bs]
    assert [small.contains(BlockKey(obj, i)) for i in range(3)] == [True, True, False]
    assert (
        small.used_bytes
        == 2 * full
        == sum(p.stat().st_size for p in (tmp_path / "small").rglob("*.blk"))
    )


def test_errors_keep_their_class_and_give_the_disk_room_back(
    seeded,
    lanes,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    store = seeded({"err/a.bin": b"a" * 5000})
    disk = disk_cache(tmp_path / "blocks")
    lane = lanes(store, disk)
    obj = obj_of(store, "err/a.bin")
    stale = ObjectId(obj.store, obj.key, '"0x8D000000000000"', obj.size)
    with pytest.raises(VersionChanged) as exc:
        read(lane, stale)
    assert exc.value.errno == errno.ESTALE
    with pytest.raises(ObjectNotFound):
        read(lane, ObjectId(obj.store, "err/missing.bin", "", 10))
    assert disk.used_bytes == 0 and not list((tmp_path / "blocks").rglob("*.blk"))
    assert read(lane, obj) == b"a" * 5000  # the lane goes on after errors


def test_a_dead_worker_leaves_the_others_and_then_the_daemon_to_read(
    seeded,
    lanes,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    blobs = {f"kill/f{i}.bin": rng.randbytes(40_000 + i) for i in range(6)}
    store = seeded(blobs)
    lane = lanes(store)
    objs = [obj_of(store, name) for name in blobs]
    first, second = lane.pids
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while alive(first) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [read(lane, o) for o in objs] == list(blobs.values())  # the other worker
    os.kill(second, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(p.open for p in lane.procs) and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(LaneUnavailable):
        read(lane, objs[0])
    # The fetcher reads in the daemon what the lane cannot take.
    scheduler = Scheduler(2)
    fetcher = BlockFetcher(
        store, NoCache(), SLAB, scheduler, MountStats(), memory_budget=4 * SLAB, lane=lane
    )
    try:
        assert [bytes(fetcher.get(BlockKey(o, 0))) for o in objs] == list(blobs.values())
    finally:
        fetcher.close()
        scheduler.close()


def test_the_account_key_is_in_no_workers_argv_or_environment(
    azurite,
    seeded,
    lanes,  # noqa: ANN001
) -> None:
    key = azurite.key.encode()
    if any(key in v.encode() for v in os.environ.values()):
        pytest.skip("the test's own environment holds the key")
    lane = lanes(seeded({"s/a.bin": b"x"}))
    seen = 0
    for pid in lane.pids:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        for one in (pid, parent):  # the worker, and the fork server that forked it
            assert key not in Path(f"/proc/{one}/cmdline").read_bytes()
            assert key not in Path(f"/proc/{one}/environ").read_bytes()
            seen += 1
    assert seen == 4


def test_callers_beyond_the_slabs_wait_and_close_releases_them(
    seeded,
    lanes,  # noqa: ANN001
) -> None:
    store = seeded({"w/a.bin": b"w" * 1000})
    lane = lanes(store, processes=1)
    obj = obj_of(store, "w/a.bin")
    results: list[object] = []

    def call() -> None:
        try:
            results.append(read(lane, obj))
        except LaneUnavailable as exc:
            results.append(exc)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [b"w" * 1000] * 6
    lane.close()
    call()
    assert isinstance(results[-1], LaneUnavailable)


@pytest.mark.unit
def test_the_knob() -> None:
    assert Settings.from_env({}).mount_processes == 1
    assert Settings.from_env({"DATAMOUNT_MOUNT_PROCESSES": "3"}).mount_processes == 3
    with pytest.raises(SettingsError, match="DATAMOUNT_MOUNT_PROCESSES"):
        Settings.from_env({"DATAMOUNT_MOUNT_PROCESSES": "0"})


@pytest.mark.fuse
def test_a_ro_mount_over_https_with_worker_processes_reads_the_bytes_and_leaves_none(
    azurite_https: Azurite, tmp_path: Path, mounts: Mounts
) -> None:
    assert azurite_https.tls is not None
    container = azurite_https.create_container(f"lane{uuid.uuid4().hex[:20]}")
    tree = {f"ds/d{i % 3}/f{i:02}.bin": rng.randbytes(SIZES[i % len(SIZES)]) for i in range(21)}
    tree["ds/big.bin"] = rng.randbytes(5 * 1024 * 1024 + 3)  # blocks, in runs
    azurite_https.seed(container, tree)
    env = mount_env(
        azurite_https,
        tmp_path,
        container.container_name,
        SSL_CERT_FILE=str(azurite_https.tls.ca),
        DATAMOUNT_MOUNT_PROCESSES="2",
    )
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ds/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    got = {str(p.relative_to(mp)): p.read_bytes() for p in sorted(mp.rglob("*")) if p.is_file()}
    assert got == {k[len("ds/") :]: v for k, v in tree.items()}
    log = (tmp_path / "cache" / "logs" / "datamount-runtime.log").read_text()
    line = next(x for x in log.splitlines() if "fetched by 2 worker processes" in x)
    pids = [int(p) for p in line.rsplit("pids ", 1)[1].split()]
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert not mounted(mp)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)
    assert not glob.glob("/dev/shm/datamount-lane-*")


@pytest.mark.unit
def test_a_store_no_worker_can_open_keeps_the_files_in_the_daemon(caplog) -> None:  # noqa: ANN001
    from datamount.mount.stack import start_lane
    from datamount.storage.memory import MemoryStore

    caplog.set_level("INFO", logger="datamount.readstack")
    settings = Settings.from_env({"DATAMOUNT_MOUNT_PROCESSES": "2"})
    assert start_lane(settings, MemoryStore(), NoCache()) is None
    assert "cannot be opened in a worker process" in caplog.text
    assert start_lane(Settings.from_env({}), MemoryStore(), NoCache()) is None  # the default


@pytest.mark.unit
def test_a_worker_that_cannot_start_is_an_oserror_and_leaves_nothing() -> None:
    before = set(glob.glob("/dev/shm/datamount-lane-*"))
    with pytest.raises(OSError, match=r"mount worker process \d+ did not start: AttributeError"):
        MountLane(None, 1, 1, 4096)  # its store's recipe cannot open: the worker dies
    assert set(glob.glob("/dev/shm/datamount-lane-*")) == before
