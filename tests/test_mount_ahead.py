"""File-ahead prefetch through real FUSE over real Azurite: a reader going
through a folder in listing order, or in a shuffled order it hints, finds
the next files fetched before it opens them; a shuffled order without hints
fetches nothing ahead. Bytes read always equal the blobs; bytes fetched are
never more than the files read plus one window. Counters come from the
stats file the daemon writes at exit."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from datamount.data import hint
from datamount.mount.control import state_file
from datamount.read.prefetch.fileahead import FolderOrder
from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file, wait_for

N = 80
NAMES = [f"s{i:03}.bin" for i in range(N)]
rng = random.Random(16)
BLOBS = {f"ahead/{n}": rng.randbytes(rng.randrange(8_000, 24_000)) for n in NAMES}
# 64 KiB blocks, a 32-block window: a PREFETCH area of 2 MiB, of which the
# file-ahead window may hold half the prefetch share (0.75): 768 KiB.
ENV = {"DATASET_MOUNT_READ_BLOCK_SIZE": "64KB"}
WINDOW = 768 * 1024
READ = 40  # the reader stops halfway: what it did not read must not be fetched


def mount(
    azurite, container, tmp_path: Path, mounts: Mounts, **settings: str
) -> tuple[Path, dict[str, str]]:  # noqa: ANN001, E501
    azurite.seed(container, BLOBS)
    env = mount_env(azurite, tmp_path, container.container_name, **ENV, **settings)
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ahead/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    return mp, env


def read_all(mp: Path, names: list[str]) -> None:
    for name in names:
        assert (mp / name).read_bytes() == BLOBS[f"ahead/{name}"]
        time.sleep(0.03)  # the training step: the prefetcher gets ahead meanwhile


def unmount(mounts: Mounts, mp: Path, env: dict[str, str]) -> dict:
    return unmount_all(mounts, mp, env)["cache"]


def unmount_all(mounts: Mounts, mp: Path, env: dict[str, str]) -> dict:
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert wait_for(lambda: not mounted(mp))
    assert wait_for(lambda: mounts.stats("input", mp).get("fs", {}).get("open_files") == 0)
    return mounts.stats("input", mp)


def size_of(names: list[str]) -> int:
    return sum(len(BLOBS[f"ahead/{n}"]) for n in names)


@pytest.mark.fuse
def test_listing_order_fetches_the_next_files_ahead(azurite, container, tmp_path, mounts) -> None:  # noqa: ANN001
    mp, env = mount(azurite, container, tmp_path, mounts)
    try:
        read_all(mp, NAMES[:READ])
    finally:
        stats = unmount(mounts, mp, env)
    assert stats["files_prefetched"] >= READ // 2
    assert stats["files_prefetch_used"] >= READ // 2  # fetched before their open
    assert stats["bytes_fetched"] <= size_of(NAMES[:READ]) + WINDOW
    assert stats["hinted_files"] == 0


@pytest.mark.fuse
def test_files_fetched_ahead_open_natively_and_make_way_for_the_next(
    azurite,
    container,
    tmp_path,
    mounts,  # noqa: ANN001
) -> None:
    # A prefetch share of 6 blocks (8 x 64 KiB x 0.75): 24 of these files at
    # most fetched ahead and unread. The native loop opens and reads them
    # from the disk tier, never through the fetcher: its hold must let them
    # go at their open, or the next ones wait HOLD_SECONDS (30 s).
    mp, env = mount(azurite, container, tmp_path, mounts, DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT="8")
    try:
        read_all(mp, NAMES)
    finally:
        stats = unmount_all(mounts, mp, env)
    cache, fs = stats["cache"], stats["fs"]
    # The first 3 opens start the folder order; every later file was fetched
    # ahead (a few may still be in flight when their open comes).
    assert cache["files_prefetch_used"] >= N - 8, cache
    assert cache["prefetch_used"] == cache["files_prefetch_used"]
    assert cache["bytes_fetched"] == size_of(NAMES)
    # Their block written, the native loop was told where: opened, read and
    # released with no call into Python.
    assert fs["native_prefetched"] >= N - 8, fs
    assert fs["native_opens"] >= N - 12, fs
    assert fs["opens"] == N
    # (and a few for the mount itself: its root's stat, the folder's first lookup)
    assert fs["python_calls"] <= 3 * (N - fs["native_opens"]) + 5, fs


def shuffled() -> list[str]:
    """A shuffle that does not look like listing order to FolderOrder."""
    for seed in range(100):
        order = list(range(N))
        random.Random(seed).shuffle(order)
        policy = FolderOrder()
        policy.add_listing("", NAMES)
        if not any(policy.on_open("", NAMES[i], 1) for i in order):
            return [NAMES[i] for i in order]
    raise AssertionError("no such shuffle")


@pytest.mark.fuse
def test_hints_fetch_a_shuffled_order_ahead(azurite, container, tmp_path, mounts) -> None:  # noqa: ANN001
    mp, env = mount(azurite, container, tmp_path, mounts)
    order = shuffled()
    try:
        state = json.loads(state_file(tmp_path / "cache", mp).read_text())
        assert state["hints_socket"].endswith(".sock")
        assert hint(mp, order[:READ]) is True
        read_all(mp, order[:READ])
    finally:
        stats = unmount(mounts, mp, env)
    assert stats["hinted_files"] == READ
    assert stats["files_prefetch_used"] >= READ // 2
    assert stats["files_prefetch_wasted"] == 0
    assert stats["bytes_fetched"] <= size_of(order[:READ]) + WINDOW


@pytest.mark.fuse
def test_a_shuffled_order_without_hints_fetches_nothing_ahead(
    azurite,
    container,
    tmp_path,
    mounts,  # noqa: ANN001
) -> None:
    mp, env = mount(azurite, container, tmp_path, mounts)
    order = shuffled()
    try:
        read_all(mp, order[:READ])
    finally:
        stats = unmount(mounts, mp, env)
    assert stats["files_prefetched"] == 0
    assert stats["bytes_fetched"] == size_of(order[:READ])


@pytest.mark.unit
def test_hint_outside_a_mount_sends_nothing(tmp_path: Path) -> None:
    assert hint(tmp_path, ["a", "b"]) is False
