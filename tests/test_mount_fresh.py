"""When a ro_mount sees a blob overwritten in storage, through real FUSE over
real Azurite, in block mode and in whole-file mode
(DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false).

The rule (README, "How ro_mount works", Consistency): an open handle stays on
the version it opened; with DATASET_MOUNT_ATTRIBUTE_CACHE_TTL set, the first
open after the TTL reads exactly the new version (its bytes and its length,
never a mix); unset, attributes never expire (Azure ML's default), so an open
keeps serving the version already seen until a read reaches storage and finds
it gone (ESTALE), after which the next open reads the new version.

The new blob always has another length than the old one: a kernel that kept
the old size would cut the new bytes short (or pad them), which these tests
would see.
"""

from __future__ import annotations

import errno
import os
import random
import time
from pathlib import Path

import pytest

from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file

pytestmark = [pytest.mark.azurite, pytest.mark.fuse]

BS = 64 * 1024
rng = random.Random(20240917)
OLD = rng.randbytes(3 * BS + 17)
LENGTHS = {"longer": 5 * BS + 3, "shorter": 5000}
MODES = {"blocks": {}, "whole-file": {"DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "false"}}


def mount(azurite, container, tmp_path: Path, mounts: Mounts, **extra: str):  # noqa: ANN001, ANN201
    env = mount_env(azurite, tmp_path, container.container_name,
                    DATASET_MOUNT_READ_BLOCK_SIZE="64KB", **extra)  # fmt: skip
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ds/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert mounted(mp)
    return mp, env


def unmount(mp: Path, env: dict[str, str]) -> None:
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr


def stale(path: Path) -> bool:
    """A read of the whole file through a new open failed with ESTALE."""
    try:
        path.read_bytes()
    except OSError as exc:
        assert exc.errno == errno.ESTALE, exc
        return True
    return False


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("mode", MODES)
def test_an_open_after_the_ttl_reads_exactly_the_new_version(
    azurite, container, tmp_path: Path, mounts: Mounts, mode: str, length: str
) -> None:  # noqa: ANN001
    new = rng.randbytes(LENGTHS[length])
    azurite.seed(container, {"ds/f.bin": OLD})
    mp, env = mount(azurite, container, tmp_path, mounts,
                    DATASET_MOUNT_ATTRIBUTE_CACHE_TTL="500", **MODES[mode])  # fmt: skip
    assert (mp / "f.bin").read_bytes() == OLD
    # Opened before the change; O_DIRECT: the page cache is the inode's, shared
    # with the opens below, so only the daemon's answers show this handle's pin.
    held = os.open(mp / "f.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        container.upload_blob("ds/f.bin", new, overwrite=True)
        time.sleep(0.7)
        assert os.stat(mp / "f.bin").st_size == len(new)
        assert (mp / "f.bin").read_bytes() == new
        assert (mp / "f.bin").read_bytes() == new  # and again, from the caches
        # The handle opened before stays on its version: the old bytes, or ESTALE.
        try:
            # (within its own length: past it, the kernel now knows the new size)
            assert os.pread(held, len(OLD), 0) == OLD
        except OSError as exc:
            assert exc.errno == errno.ESTALE
    finally:
        os.close(held)
    unmount(mp, env)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("mode", MODES)
def test_the_kernel_never_keeps_the_old_size_past_the_namespace(
    azurite, container, tmp_path: Path, mounts: Mounts, mode: str, length: str
) -> None:  # noqa: ANN001
    """The kernel's attribute timeout runs from when it asked: here it is told
    f.bin's attributes 0.6 s after the folder listing filled the namespace, so
    it holds them 0.6 s longer than the namespace does. An open between the
    two pins the new version; the kernel must not cut it at the old size."""
    new = rng.randbytes(LENGTHS[length])
    azurite.seed(container, {"ds/f.bin": OLD, "ds/a.txt": b"a"})
    mp, env = mount(azurite, container, tmp_path, mounts,
                    DATASET_MOUNT_ATTRIBUTE_CACHE_TTL="1000", **MODES[mode])  # fmt: skip
    os.stat(mp / "a.txt")  # lists the folder: f.bin's attributes cached now
    time.sleep(0.6)
    assert os.stat(mp / "f.bin").st_size == len(OLD)  # the kernel's copy, until ~1.6 s
    container.upload_blob("ds/f.bin", new, overwrite=True)
    time.sleep(0.6)  # the namespace's copy expired, the kernel's not yet
    assert (mp / "f.bin").read_bytes() == new
    assert os.stat(mp / "f.bin").st_size == len(new)
    unmount(mp, env)


@pytest.mark.parametrize("mode", MODES)
def test_unset_ttl_serves_the_version_seen_whole(
    azurite, container, tmp_path: Path, mounts: Mounts, mode: str
) -> None:  # noqa: ANN001
    """Attributes never expire: a file read whole before the change is served
    on as it was (page cache, blocks or the whole-file copy), never mixed."""
    new = rng.randbytes(LENGTHS["longer"])
    azurite.seed(container, {"ds/f.bin": OLD})
    mp, env = mount(azurite, container, tmp_path, mounts, **MODES[mode])
    assert (mp / "f.bin").read_bytes() == OLD
    container.upload_blob("ds/f.bin", new, overwrite=True)
    time.sleep(0.7)
    for _ in range(2):
        assert os.stat(mp / "f.bin").st_size == len(OLD)
        assert (mp / "f.bin").read_bytes() == OLD
        fd = os.open(mp / "f.bin", os.O_RDONLY | os.O_DIRECT)  # past the page cache
        try:
            assert os.pread(fd, len(OLD) + BS, 0) == OLD
        finally:
            os.close(fd)
    unmount(mp, env)


@pytest.mark.parametrize("length", LENGTHS)
def test_unset_ttl_block_mode_a_read_that_finds_the_change_moves_on(
    azurite, container, tmp_path: Path, mounts: Mounts, length: str
) -> None:  # noqa: ANN001
    """Attributes never expire, but a read that reaches storage for the old
    version fails with ESTALE; the next open reads the new version, at its
    own length."""
    new = rng.randbytes(LENGTHS[length])
    azurite.seed(container, {"ds/f.bin": OLD})
    mp, env = mount(azurite, container, tmp_path, mounts,
                    DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT="0")  # fmt: skip
    fd = os.open(mp / "f.bin", os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.pread(fd, BS, 0) == OLD[:BS]  # one block of the old version cached
    finally:
        os.close(fd)
    container.upload_blob("ds/f.bin", new, overwrite=True)
    assert stale(mp / "f.bin")  # its second block is not the old version any more
    assert (mp / "f.bin").read_bytes() == new
    assert os.stat(mp / "f.bin").st_size == len(new)
    unmount(mp, env)
