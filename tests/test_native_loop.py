"""ro_mount's native FUSE loop (fs/_lowlevel.c) through real FUSE over real
Azurite: what it answers without Python, and that what it reads from the disk
tier is exactly the pinned version's bytes or nothing.

- inode numbers: one per path, stable for the mount's life, the same in a
  listing as in a stat;
- names the native table knows (from a listing) are looked up and stat'ed
  without a call into Python;
- a file whose every block is in the disk tier at open is read from the block
  files without Python (a remount over the same cache: a restarted job); a
  block file that is corrupt, truncated or of another version is never
  served: Python reads the block again, exactly.

Blocks are 64 KiB (DATASET_MOUNT_READ_BLOCK_SIZE); reads that must reach the
daemon use O_DIRECT handles.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fuse_helpers import Mounts, wait_for
from test_mount_blocks import (
    BS,
    block_files,
    env_for,
    folder_spec,
    mount_ok,
    nblocks,
    read_direct,
    rng,
    unmount_ok,
)

pytestmark = [pytest.mark.azurite, pytest.mark.fuse]


def test_inode_numbers_are_one_per_path_and_listings_need_no_python_lookup(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    tree = {f"ds/d{i}/f{j}.bin": rng.randbytes(100 + j) for i in range(3) for j in range(5)}
    azurite.seed(container, tree)
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)

    listed = {}
    for entry in os.scandir(mp):
        listed[entry.name] = entry.inode()
        for child in os.scandir(entry.path):
            listed[f"{entry.name}/{child.name}"] = child.inode()
    assert len(listed) == 3 + 15 and len(set(listed.values())) == len(listed)
    for name, ino in listed.items():  # stat agrees with the listing, every time
        assert os.stat(mp / name).st_ino == ino
        assert os.stat(mp / name).st_ino == ino
    assert os.stat(mp).st_ino == 1
    assert (mp / "d1" / "f3.bin").read_bytes() == tree["ds/d1/f3.bin"]

    fs = unmount_ok(mounts, mp, env)["fs"]
    # The listings came with attributes (readdirplus): no stat above asked Python,
    # only the daemon's own stat of the mount point as it started.
    assert fs["getattrs"] == 1, fs
    assert fs["inodes"] == 1 + 3 + 15


def cached_once(azurite, container, tmp_path: Path, mounts: Mounts, files: dict[str, bytes]):  # noqa: ANN001, ANN201
    """Seed `files`, read each through a first mount until every block is in
    the disk tier, unmount: (env, mount point, cache folder, that mount's stats)."""
    azurite.seed(container, files)
    env = env_for(azurite, tmp_path, container)
    cache = tmp_path / "cache"
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(folder_spec(tmp_path), mp, env)
    for key, body in files.items():
        assert read_direct(mp / key[3:]) == body
    n = sum(nblocks(len(body)) for body in files.values())
    assert wait_for(lambda: len(block_files(cache)) == n)
    return env, mp, cache, unmount_ok(mounts, mp, env)


def test_a_remount_reads_cached_files_without_python_and_exactly(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    files = {"ds/small.bin": rng.randbytes(BS - 3), "ds/big.bin": rng.randbytes(9 * BS + 11)}
    env, mp, _, first = cached_once(azurite, container, tmp_path, mounts, files)
    assert first["fs"]["native_reads"] == 0  # nothing was on disk at its open

    mount_ok(folder_spec(tmp_path), mp, env)
    for key, body in files.items():
        assert read_direct(mp / key[3:], chunk=BS // 2 + 5) == body  # reads across blocks
        fd = os.open(mp / key[3:], os.O_RDONLY | os.O_DIRECT)
        try:  # a read past the end, and one that ends past it
            assert os.pread(fd, BS, len(body) + 10) == b""
            assert os.pread(fd, BS, len(body) - 7) == body[-7:]
        finally:
            os.close(fd)
    again = unmount_ok(mounts, mp, env)
    # small.bin is one block: its lookup told the native side where that block is, and
    # both its opens stayed there; big.bin (10 blocks) is opened by Python each time.
    assert again["fs"]["native_opens"] == 2 and again["fs"]["opens"] == 4
    total = sum(map(len, files.values()))
    assert again["cache"]["bytes_fetched"] == 0
    assert again["cache"]["disk_hits"] == again["cache"]["ram_hits"] == 0
    assert again["fs"]["native_read_bytes"] == total + 7 * len(files)
    assert again["fs"]["bytes_read"] == again["fs"]["native_read_bytes"]


@pytest.mark.parametrize("damage", ["flipped data byte", "truncated", "other etag in header"])
def test_a_bad_block_file_is_never_served_python_reads_the_block_again(
    azurite, container, tmp_path: Path, mounts: Mounts, damage: str
) -> None:  # noqa: ANN001
    body = rng.randbytes(3 * BS)
    env, mp, cache, _ = cached_once(azurite, container, tmp_path, mounts, {"ds/f.bin": body})

    victim = max(block_files(cache), key=lambda p: p.read_bytes().find(body[BS : BS + 64]))
    raw = bytearray(victim.read_bytes())
    at = raw.find(body[BS : BS + 64])
    assert at > 0  # the middle block's file
    if damage == "flipped data byte":
        raw[at + 100] ^= 0xFF
    elif damage == "truncated":
        raw = raw[:-1]
    else:
        etag = raw.find(b'"0x')
        assert etag > 0
        raw[etag + 3] = ord("1") if raw[etag + 3] != ord("1") else ord("2")
    victim.write_bytes(bytes(raw))

    mount_ok(folder_spec(tmp_path), mp, env)
    assert read_direct(mp / "f.bin", chunk=BS) == body
    stats = unmount_ok(mounts, mp, env)
    # The two good blocks came from their files, the bad one from storage again.
    assert stats["fs"]["native_read_bytes"] == 2 * BS
    assert stats["cache"]["bytes_fetched"] == BS


def test_a_native_open_whose_block_went_is_read_through_python_pinned_to_that_version(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    files = {f"ds/f{i}.bin": rng.randbytes(BS // 2 + i) for i in range(4)}
    env, mp, cache, _ = cached_once(azurite, container, tmp_path, mounts, files)

    mount_ok(folder_spec(tmp_path), mp, env)
    assert sorted(os.listdir(mp)) == sorted(k[3:] for k in files)  # the table knows them all
    for path in block_files(cache):  # then the disk tier loses every block
        path.unlink()
    for key, body in files.items():
        assert read_direct(mp / key[3:]) == body
    stats = unmount_ok(mounts, mp, env)
    # Opened natively (the listing said cached), read through Python: each file's
    # version fetched again, exactly once.
    assert stats["fs"]["native_opens"] == len(files)
    assert stats["fs"]["opens"] == len(files)  # each once, though Python read it too
    assert stats["fs"]["native_reads"] == 0
    assert stats["cache"]["bytes_fetched"] == sum(map(len, files.values()))


@pytest.mark.parametrize("ttl", [None, "1"], ids=["never expires", "1 ms TTL"])
def test_a_folder_listed_again_is_served_by_the_kernel_when_listings_never_expire(
    azurite, container, tmp_path: Path, mounts: Mounts, ttl: str | None
) -> None:  # noqa: ANN001
    tree = {f"ds/d/f{j}.bin": b"x" * j for j in range(30)}
    azurite.seed(container, tree)
    extra = {} if ttl is None else {"DATASET_MOUNT_ATTRIBUTE_CACHE_TTL": ttl}
    env = env_for(azurite, tmp_path, container, **extra)
    mp = mounts.point(tmp_path / "mnt")
    names = sorted(k[5:] for k in tree)

    def listings(times: int) -> int:  # the listing requests that reached the daemon
        mount_ok(folder_spec(tmp_path), mp, env)
        for _ in range(times):
            assert sorted(os.listdir(mp / "d")) == names
        return unmount_ok(mounts, mp, env)["fs"]["readdir_requests"]

    once = listings(1)
    assert once >= 1
    # Never expiring, the kernel keeps the first listing (cache_readdir) and serves
    # the next ones itself; with a TTL every listing reaches the daemon.
    assert listings(3) == (once if ttl is None else 3 * once)
