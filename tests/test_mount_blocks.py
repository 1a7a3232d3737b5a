"""ro_mount's read path through real FUSE over real Azurite: block-boundary
content, concurrency, the effect of every cache setting, prefetch, faults
injected by a real proxy (tests/faultproxy.py), version changes, crash
recovery, and data assets.

Blocks are 64 KiB (DATASET_MOUNT_READ_BLOCK_SIZE) so the data stays small.
Reads that must reach the daemon use O_DIRECT handles: FUSE then sends the
exact (offset, size) to the daemon instead of serving the page cache.
Counters come from the stats file the daemon writes at exit
(<cache>/logs/mount-stats-input-<hash>.json). Every mount point goes through the
`mounts` fixture, which detaches and kills whatever a test leaves behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datamount.mount.control import alive, is_stale, state_file
from faultproxy import FaultProxy
from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file, wait_for

pytestmark = [pytest.mark.azurite, pytest.mark.fuse]

BS = 64 * 1024
MIB = 1024 * 1024
BLOCK_ENV = {"DATASET_MOUNT_READ_BLOCK_SIZE": "64KB"}
# No prefetch: a read fetches exactly the blocks it covers, and the fetcher
# holds back a single block (its memory budget is one window, at least a block).
NO_PREFETCH = {"DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "0"}

rng = random.Random(20240611)
SIZES = {
    "empty.bin": 0,
    "one.bin": 1,
    "bs-1.bin": BS - 1,
    "bs.bin": BS,
    "bs+1.bin": BS + 1,
    "3bs+7.bin": 3 * BS + 7,
    "big.bin": 2 * MIB + 12_345,
}
FILES = {name: rng.randbytes(size) for name, size in SIZES.items()}


# -- helpers -----------------------------------------------------------------


def env_for(azurite, tmp_path: Path, container, *, via=None, **extra: str) -> dict[str, str]:  # noqa: ANN001
    """mount_env with 64 KiB blocks; `via` a FaultProxy puts it in front of Azurite."""
    service = azurite
    if via is not None:
        service = SimpleNamespace(account=azurite.account, key=azurite.key, endpoint=via.endpoint)
    return mount_env(service, tmp_path, container.container_name, **{**BLOCK_ENV, **extra})


def folder_spec(tmp_path: Path, path: str = "ds/") -> Path:
    return spec_file(tmp_path, "input", "uri_folder", f"azureml://datastores/store/paths/{path}")


def mount_ok(spec: Path, mp: Path, env: dict[str, str]) -> str:
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert mounted(mp)
    return out.stdout


def unmount_ok(mounts: Mounts, mp: Path, env: dict[str, str]) -> dict:
    """Unmount, wait for the daemon to exit; its final counters."""
    pid = mounts.daemon(mp)
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert not mounted(mp)
    assert wait_for(lambda: not alive(pid)), f"daemon {pid} still running"
    stats = mounts.stats("input", mp)
    assert stats["pid"] == pid
    return stats


def read_direct(path: Path, chunk: int = 4 * BS) -> bytes:
    """The whole file through a new O_DIRECT handle: every byte from the daemon."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        parts = []
        offset = 0
        while data := os.pread(fd, chunk, offset):
            parts.append(data)
            offset += len(data)
        return b"".join(parts)
    finally:
        os.close(fd)


def block_files(cache: Path) -> list[Path]:
    """The disk tier's block files (not the writers' temporary files)."""
    return [p for p in (cache / "blocks").rglob("*.blk") if p.parent.name != "tmp"]


def blocks_bytes(cache: Path) -> int:
    total = 0
    for p in block_files(cache):
        with contextlib.suppress(FileNotFoundError):  # pruned meanwhile
            total += p.stat().st_size
    return total


def nblocks(size: int, bs: int = BS) -> int:
    return -(-size // bs)


# -- content -------------------------------------------------------------------


def test_random_preads_equal_the_source(azurite, container, tmp_path: Path, mounts: Mounts) -> None:  # noqa: ANN001
    azurite.seed(container, {f"ds/{n}": b for n, b in FILES.items()})
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    assert sorted(os.listdir(mp)) == sorted(FILES)
    handles: dict[tuple[str, bool], int] = {}
    try:
        # Every block boundary of every file, straddled narrowly and widely.
        for name, body in FILES.items():
            fd = handles[(name, True)] = os.open(mp / name, os.O_RDONLY | os.O_DIRECT)
            for edge in range(0, len(body) + BS + 1, BS):
                for off, n in ((edge - 3, 6), (edge - BS - 1, 2 * BS + 2), (edge, BS)):
                    off = max(0, off)
                    assert os.pread(fd, n, off) == body[off : off + n], (name, off, n)

        @settings(
            max_examples=60,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(st.data())
        def check(data: st.DataObject) -> None:
            name = data.draw(st.sampled_from(sorted(FILES)), label="file")
            body = FILES[name]
            direct = data.draw(st.booleans(), label="O_DIRECT")
            # Offsets cluster around block boundaries, and run past the end.
            edge = data.draw(st.integers(0, nblocks(len(body)) + 1), label="block") * BS
            offset = data.draw(
                st.one_of(
                    st.integers(max(0, edge - 3), edge + 3),
                    st.integers(0, len(body) + BS),
                ),
                label="offset",
            )
            size = data.draw(
                st.one_of(
                    st.integers(0, 5),
                    st.sampled_from([BS - 1, BS, BS + 1, 2 * BS + 1, 3 * BS]),
                    st.integers(0, 4 * BS),
                ),
                label="size",
            )
            key = (name, direct)
            if key not in handles:
                flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
                handles[key] = os.open(mp / name, flags)
            assert os.pread(handles[key], size, offset) == body[offset : offset + size]

        check()
    finally:
        for fd in handles.values():
            os.close(fd)
    stats = unmount_ok(mounts, mp, env)
    assert stats["fs"]["read_errors"] == 0


def test_concurrent_readers_on_one_file_and_on_many(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    many = {f"m{i:03d}.bin": rng.randbytes(rng.randrange(0, 5 * BS)) for i in range(60)}
    big = FILES["big.bin"]
    azurite.seed(container, {"ds/big.bin": big, **{f"ds/many/{n}": b for n, b in many.items()}})
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)

    def preads(seed: int) -> int:
        r = random.Random(seed)
        flags = os.O_RDONLY | (os.O_DIRECT if seed % 2 else 0)
        fd = os.open(mp / "big.bin", flags)
        try:
            for _ in range(40):
                off = r.randrange(len(big))
                n = r.randrange(1, 3 * BS)
                assert os.pread(fd, n, off) == big[off : off + n], (seed, off, n)
        finally:
            os.close(fd)
        return seed

    with ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(preads, range(16))) == list(range(16))

    def whole(name: str) -> str:
        path = mp / "many" / name
        got = read_direct(path) if len(name) % 2 else path.read_bytes()
        assert got == many[name], name
        return name

    names = sorted(many) * 2
    random.Random(1).shuffle(names)
    with ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(whole, names)) == sorted(names)
    stats = unmount_ok(mounts, mp, env)
    assert stats["fs"]["read_errors"] == 0
    # Single flight and the cache: no block of any file was downloaded twice.
    total = len(big) + sum(map(len, many.values()))
    assert stats["cache"]["bytes_fetched"] <= total


# -- every setting has an effect ---------------------------------------------------


TIERS = {
    "both-on": {},
    "ram-off": {"DATASET_MOUNT_MEMORY_CACHE_SIZE": "0"},
    "disk-off": {"DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "false"},
    "both-off": {
        "DATASET_MOUNT_MEMORY_CACHE_SIZE": "0",
        "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "false",
    },
}


@pytest.mark.parametrize("tiers", sorted(TIERS))
def test_cache_tiers_serve_re_reads(
    azurite, container, tmp_path: Path, mounts: Mounts, tiers: str
) -> None:  # noqa: ANN001
    body = rng.randbytes(16 * BS + 100)  # 17 blocks
    n = nblocks(len(body))
    azurite.seed(container, {"ds/f.bin": body})
    env = env_for(azurite, tmp_path, container, **NO_PREFETCH, **TIERS[tiers])
    cache = tmp_path / "cache"
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    ram = "ram-off" not in tiers and "both-off" not in tiers
    disk = "disk-off" not in tiers and "both-off" not in tiers

    assert read_direct(mp / "f.bin") == body
    if disk:  # written in the background: wait for the last one
        assert wait_for(lambda: len(block_files(cache)) == n), len(block_files(cache))
    # A new O_DIRECT handle: the page cache cannot answer, the daemon must.
    assert read_direct(mp / "f.bin") == body
    everything = unmount_ok(mounts, mp, env)
    stats, fs = everything["cache"], everything["fs"]

    assert len(block_files(cache)) == (n if disk else 0)
    if disk:  # every block on disk at the open: the native loop reads the files, no Python
        assert fs["native_read_bytes"] == len(body) and fs["native_reads"] == 5
        assert stats["disk_hits"] == stats["ram_hits"] == 0
        assert stats["bytes_fetched"] == len(body)
    elif ram:  # the RAM tier answers the re-read
        assert stats["ram_hits"] >= n - 1 and stats["disk_hits"] == 0
        assert fs["native_reads"] == 0
        assert stats["bytes_fetched"] == len(body)
    else:  # nothing keeps blocks but the fetcher's one-block hold: fetched again
        assert stats["ram_hits"] == stats["disk_hits"] == 0
        assert stats["bytes_fetched"] >= 2 * len(body) - BS
        assert stats["blocks_fetched"] >= 2 * n - 1


def test_whole_file_mode_caches_the_file_at_open(
    azurite, container, tmp_path: Path, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    body, shared = rng.randbytes(MIB + 3), rng.randbytes(3 * MIB + 1)
    azurite.seed(container, {"ds/w.bin": body, "ds/small.txt": b"small", "ds/c.bin": shared})
    env = env_for(azurite, tmp_path, container, via=proxy,
                  DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED="false")  # fmt: skip
    files = tmp_path / "cache" / "files"
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)

    fd = os.open(mp / "w.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        # Before any read: open waited for the whole file to be in the cache.
        cached = [p for p in files.rglob("*") if p.is_file() and not p.name.startswith(".")]
        assert [p.stat().st_size for p in cached] == [len(body)]  # only the opened file
        assert cached[0].read_bytes() == body
        assert os.pread(fd, 2 * BS, BS - 1) == body[BS - 1 : 3 * BS - 1]
    finally:
        os.close(fd)
    gets = len(proxy.ranged_gets("ds/w.bin"))
    inode = cached[0].stat().st_ino
    # A second open uses the cached file: no new download.
    assert read_direct(mp / "w.bin") == body
    assert len(proxy.ranged_gets("ds/w.bin")) == gets
    assert cached[0].stat().st_ino == inode
    assert (mp / "small.txt").read_bytes() == b"small"

    # Concurrent first opens of one file share one download.
    def first_open(_: int) -> bool:
        return read_direct(mp / "c.bin") == shared

    with ThreadPoolExecutor(6) as pool:
        assert all(pool.map(first_open, range(6)))
    ranges = [r.range for r in proxy.ranged_gets("ds/c.bin")]
    spans = [tuple(map(int, r.split("=")[1].split("-"))) for r in ranges if r]
    assert sum(hi - lo + 1 for lo, hi in spans) == len(shared), spans
    stats = unmount_ok(mounts, mp, env)["cache"]
    assert stats["blocks_fetched"] == 0  # no block mode underneath
    assert not block_files(tmp_path / "cache")


def test_tiny_cache_prunes_and_never_exceeds_its_bound(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    body = rng.randbytes(32 * BS)
    limit = 400 * 1024  # six blocks with their headers
    azurite.seed(container, {"ds/f.bin": body})
    env = env_for(azurite, tmp_path, container, **NO_PREFETCH,
                  DATASET_MOUNT_CACHE_SIZE="400KB")  # fmt: skip
    cache = tmp_path / "cache"
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)

    def settled() -> int:
        """The folder's size once the background writers are idle."""
        previous, deadline = -1, time.monotonic() + 10
        while time.monotonic() < deadline:
            busy = any((cache / "blocks").rglob("*.tmp"))
            now = blocks_bytes(cache)
            if not busy and now == previous:
                break
            previous = now
            time.sleep(0.03)
        return blocks_bytes(cache)

    sizes = []
    fd = os.open(mp / "f.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        for i in range(32):
            assert os.pread(fd, BS, i * BS) == body[i * BS : (i + 1) * BS]
            sizes.append(settled())
    finally:
        os.close(fd)
    stats = unmount_ok(mounts, mp, env)["cache"]
    assert max(sizes) <= limit, sizes
    assert max(sizes) > limit // 2  # it did cache, up to near its bound
    assert stats["disk_evictions"] > 0
    assert 0 < blocks_bytes(cache) <= limit


@pytest.mark.parametrize("mode", ["block", "whole-file"])
def test_reserved_free_space_keeps_the_cache_off_the_disk(
    azurite, container, tmp_path: Path, mounts: Mounts, mode: str
) -> None:  # noqa: ANN001
    body = rng.randbytes(5 * BS + 1)
    azurite.seed(container, {"ds/f.bin": body})
    # More than any disk has free: the cache may not write a byte.
    env = env_for(azurite, tmp_path, container, DATASET_RESERVED_FREE_DISK_SPACE="1000TB",
                  DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=str(mode == "block").lower())  # fmt: skip
    cache = tmp_path / "cache"
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    assert read_direct(mp / "f.bin") == body
    assert (mp / "f.bin").read_bytes() == body
    stats = unmount_ok(mounts, mp, env)["cache"]
    assert not block_files(cache)
    assert not [p for p in (cache / "files").rglob("*") if p.is_file()]
    # Served by block streaming all the same (whole-file mode falls back to it).
    assert stats["bytes_fetched"] >= len(body)


def test_odd_block_size(azurite, container, tmp_path: Path, mounts: Mounts) -> None:  # noqa: ANN001
    bs = 100 * 1024
    body = rng.randbytes(1_000_003)
    azurite.seed(container, {"ds/f.bin": body})
    env = env_for(azurite, tmp_path, container, DATASET_MOUNT_READ_BLOCK_SIZE="100KB")
    cache = tmp_path / "cache"
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    assert read_direct(mp / "f.bin", chunk=MIB) == body
    fd = os.open(mp / "f.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        for edge in range(bs, len(body), bs):  # every block boundary, straddled
            assert os.pread(fd, 10, edge - 5) == body[edge - 5 : edge + 5]
    finally:
        os.close(fd)
    n = nblocks(len(body), bs)
    assert wait_for(lambda: len(block_files(cache)) == n)
    stats = unmount_ok(mounts, mp, env)["cache"]
    assert stats["blocks_fetched"] == n and stats["bytes_fetched"] == len(body)
    sizes = sorted(p.stat().st_size for p in block_files(cache))
    # Blocks of 64 KiB and more are written paged (blockfile.py): a page of
    # header, then the data padded to whole pages (100 KiB is 25 pages).
    page, last = 4096, len(body) - (n - 1) * bs
    assert sizes.count(page + bs) == n - 1
    assert sizes[0] == page + -(-last // page) * page


# -- prefetch ----------------------------------------------------------------------


def test_sequential_reader_prefetches_ahead(
    azurite, container, tmp_path: Path, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    body = rng.randbytes(32 * BS)
    azurite.seed(container, {"ds/seq.bin": body})
    env = env_for(azurite, tmp_path, container, via=proxy)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    fd = os.open(mp / "seq.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        for i in range(4):
            assert os.pread(fd, BS, i * BS) == body[i * BS : (i + 1) * BS]

        def fetched() -> set[int]:  # every block some ranged GET covered
            spans = (map(int, r.range.split("=")[1].split("-")) for r in proxy.ranged_gets())
            return {b for lo, hi in spans for b in range(lo // BS, hi // BS + 1)}

        # Blocks the reader has not asked for yet were requested from storage.
        assert wait_for(lambda: max(fetched(), default=-1) >= 8), sorted(fetched())
        for i in range(4, 32):
            assert os.pread(fd, BS, i * BS) == body[i * BS : (i + 1) * BS]
    finally:
        os.close(fd)
    stats = unmount_ok(mounts, mp, env)["cache"]
    assert stats["prefetched_blocks"] >= 16 and stats["prefetch_used"] >= 16
    assert stats["prefetch_wasted"] == 0
    # Each block once: the demand reads joined the prefetches, and consecutive
    # prefetched blocks shared their requests.
    assert stats["blocks_fetched"] == 32 and stats["bytes_fetched"] == len(body)
    gets = proxy.ranged_gets("ds/seq.bin")
    assert sum(
        int(hi) - int(lo) + 1 for lo, hi in (r.range.split("=")[1].split("-") for r in gets)
    ) == len(body)
    assert len(gets) == stats["fetch_requests"] < 32


@pytest.mark.parametrize("direct", [True, False], ids=["O_DIRECT", "buffered"])
def test_random_reader_pays_only_for_the_blocks_it_touches(
    azurite, container, tmp_path: Path, mounts: Mounts, proxy: FaultProxy, direct: bool
) -> None:  # noqa: ANN001
    body = rng.randbytes(8 * MIB)  # 128 blocks
    azurite.seed(container, {"ds/rand.bin": body})
    env = env_for(azurite, tmp_path, container, via=proxy)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    r = random.Random(7)
    touched: set[int] = set()
    fd = os.open(mp / "rand.bin", os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        for _ in range(40):
            off = r.randrange(BS, len(body) - 8192)  # never the first block: no scan start
            off -= off % 4096
            assert os.pread(fd, 4096, off) == body[off : off + 4096]
            touched.add(off // BS)
    finally:
        os.close(fd)
    stats = unmount_ok(mounts, mp, env)["cache"]
    assert stats["bytes_fetched"] <= 2 * len(touched) * BS, (len(touched), stats)
    assert stats["prefetched_blocks"] <= 2, stats
    got = sum(int(g.range.split("-")[1]) - int(g.range.split("=")[1].split("-")[0]) + 1
              for g in proxy.ranged_gets("ds/rand.bin"))  # fmt: skip
    assert got == stats["bytes_fetched"]


# -- faults ------------------------------------------------------------------------


def test_transient_503s_and_resets_are_retried(
    azurite, container, tmp_path: Path, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    files = {f"f{i}.bin": rng.randbytes(rng.randrange(3 * BS, 6 * BS)) for i in range(4)}
    azurite.seed(container, {f"ds/{n}": b for n, b in files.items()})
    env = env_for(azurite, tmp_path, container, via=proxy)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    proxy.fail_ranged(4)
    proxy.reset_ranged(3)
    for name, body in files.items():
        assert read_direct(mp / name) == body, name
    assert proxy.pending() == (0, 0)  # every fault fired
    assert (mp / "f0.bin").read_bytes() == files["f0.bin"]
    injected = [r.injected for r in proxy.ranged_gets()]
    assert injected.count("fail") == 4 and injected.count("reset") == 3
    stats = unmount_ok(mounts, mp, env)
    assert stats["fs"]["read_errors"] == 0
    total = sum(map(len, files.values()))
    blocks = sum(nblocks(len(b)) for b in files.values())
    # Every block was fetched once, each failed attempt repeated.
    assert stats["cache"]["retries"] == 7
    assert stats["cache"]["blocks_fetched"] == blocks
    assert stats["cache"]["bytes_fetched"] == total
    assert len(proxy.ranged_gets()) == stats["cache"]["fetch_requests"] + 7


def test_permanent_403_is_eacces_and_the_daemon_survives(
    azurite, container, tmp_path: Path, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    secret, other = rng.randbytes(3 * BS), rng.randbytes(2 * BS + 5)
    azurite.seed(container, {"ds/secret.bin": secret, "ds/other.bin": other})
    env = env_for(azurite, tmp_path, container, via=proxy)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    pid = mounts.daemon(mp)
    proxy.deny("ds/secret.bin")
    with pytest.raises(PermissionError) as caught:
        read_direct(mp / "secret.bin")
    assert caught.value.errno == errno.EACCES
    # Permanent: each block was asked for once, never retried.
    denied = [r.range for r in proxy.ranged_gets("ds/secret.bin")]
    assert 1 <= len(denied) == len(set(denied)) <= 3
    with pytest.raises(PermissionError):
        (mp / "secret.bin").read_bytes()  # through the page cache too
    assert alive(pid) and sorted(os.listdir(mp)) == ["other.bin", "secret.bin"]
    assert read_direct(mp / "other.bin") == other
    assert (mp / "other.bin").read_bytes() == other
    # Nothing of the failure was cached: once allowed, the file reads.
    proxy.allow("ds/secret.bin")
    assert read_direct(mp / "secret.bin") == secret
    stats = unmount_ok(mounts, mp, env)
    assert stats["fs"]["read_errors"] >= 2


@pytest.mark.parametrize("how", ["no-prefetch", "defaults"])
def test_blob_overwritten_mid_read_never_mixes_versions(
    azurite, container, tmp_path: Path, mounts: Mounts, how: str
) -> None:  # noqa: ANN001
    old, new = rng.randbytes(32 * BS), rng.randbytes(32 * BS)
    azurite.seed(container, {"ds/v.bin": old})
    extra = NO_PREFETCH if how == "no-prefetch" else {}
    env = env_for(azurite, tmp_path, container, **extra)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    direct = how == "no-prefetch"  # O_DIRECT: every read reaches the daemon
    fd = os.open(mp / "v.bin", os.O_RDONLY | (os.O_DIRECT if direct else 0))
    got = bytearray()
    error: OSError | None = None
    try:
        while len(got) < 4 * BS:
            got += os.pread(fd, BS, len(got))
        container.upload_blob("ds/v.bin", new, overwrite=True)
        while len(got) < len(old):
            try:
                data = os.pread(fd, 2 * BS, len(got))
            except OSError as exc:
                error = exc
                break
            assert data
            got += data
    finally:
        os.close(fd)
    # The old version, whole or cut short by an error: never a mix.
    assert bytes(got) == old[: len(got)]
    if error is not None:
        assert error.errno in (errno.ESTALE, errno.EIO), error
    if direct:  # nothing of the rest was fetched before the change
        assert error is not None and error.errno == errno.ESTALE
        assert len(got) == 4 * BS

    def whole() -> bytes:
        """The file read by a new open; an open that pinned the old version
        (still in the attribute cache) fails once, and the next one re-reads."""
        try:
            return (mp / "v.bin").read_bytes()
        except OSError as exc:
            assert exc.errno == errno.ESTALE
            return (mp / "v.bin").read_bytes()

    after = whole()
    if error is not None:  # the change was seen: the next open pins the new version
        assert after == new
    else:  # attributes never expire: the old version may be served on, but whole
        assert after in (old, new)
    stats = unmount_ok(mounts, mp, env)
    assert stats["fs"]["stale_reads"] >= (1 if error is not None else 0)


def test_sigkill_then_mount_reuses_the_disk_cache(
    azurite, container, tmp_path: Path, mounts: Mounts, proxy: FaultProxy
) -> None:  # noqa: ANN001
    body = rng.randbytes(16 * BS + 5)  # 17 blocks
    n = nblocks(len(body))
    azurite.seed(container, {"ds/f.bin": body})
    # No restart in place (test_mount_heal.py): the next mount clears the stale one.
    env = env_for(azurite, tmp_path, container, via=proxy, DATAMOUNT_MOUNT_MAX_RESTARTS="0")
    cache = tmp_path / "cache"
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    assert read_direct(mp / "f.bin") == body
    gets = proxy.ranged_gets("ds/f.bin")  # each byte once, in one or several blocks per GET
    assert sum(int(hi) - int(lo) + 1 for lo, hi in (g.range[6:].split("-") for g in gets)) == len(
        body
    )
    assert wait_for(lambda: len(block_files(cache)) == n)
    pid = mounts.daemon(mp)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not alive(pid))
    assert is_stale(mp)

    proxy.reset()
    mount_ok(folder_spec(tmp_path), mp, env)  # clears the stale mount
    assert mounts.daemon(mp) != pid
    assert read_direct(mp / "f.bin") == body
    assert proxy.ranged_gets("ds/f.bin") == []  # every block came from the disk cache
    everything = unmount_ok(mounts, mp, env)
    assert everything["cache"]["bytes_fetched"] == 0
    assert everything["fs"]["native_read_bytes"] == len(body)  # the files read without Python
    assert not state_file(cache, mp).exists()


# -- specs -------------------------------------------------------------------------


def test_data_assets_mount_as_uri_file_and_uri_folder(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    model = rng.randbytes(3 * BS + 7)
    tree = {"a.txt": b"alpha", "sub/b.bin": rng.randbytes(BS + 1)}
    azurite.seed(
        container,
        {"models/v1/model.bin": model, **{f"data/{k}": v for k, v in tree.items()}},
    )
    env = env_for(azurite, tmp_path, container)
    ws = Path(env["DATAMOUNT_WORKSPACE"])
    ws.write_text(
        ws.read_text() + "data_assets:\n"
        "  model: [{version: '1', type: uri_file, path: 'azureml://datastores/store/paths/models/v1/model.bin'}]\n"
        "  tree:\n"
        "    - {version: '1', type: uri_folder, path: 'azureml://datastores/store/paths/data/'}\n"
        "    - {version: '2', type: uri_folder, path: 'azureml://datastores/store/paths/models/'}\n"
    )
    file_mp = mounts.point(tmp_path / "file_mnt")
    out = mount_ok(spec_file(tmp_path, "model", "uri_file", "azureml:model:1"), file_mp, env)
    assert out == f"{file_mp / 'model.bin'}\n"
    assert os.listdir(file_mp) == ["model.bin"]
    assert read_direct(file_mp / "model.bin") == model
    unmount_ok(mounts, file_mp, env)

    folder_mp = mounts.point(tmp_path / "folder_mnt")
    out = mount_ok(spec_file(tmp_path, "tree", "uri_folder", "azureml:tree:1"), folder_mp, env)
    assert out == f"{folder_mp}\n"
    assert sorted(os.listdir(folder_mp)) == ["a.txt", "sub"]
    for rel, body in tree.items():
        assert (folder_mp / rel).read_bytes() == body
    unmount_ok(mounts, folder_mp, env)
