"""POSIX behaviour of open files in an rw_mount (real FUSE over real Azurite), the
cases pjdfstest and everyday programs meet: a file unlinked while open keeps
serving its bytes and fstat answers nlink 0 (tempfile.TemporaryFile); a handle on
a renamed file reads on; a reader holding a file that a writer replaces with
rename(tmp, name) (how checkpoints are written) reads the old bytes, whole, and
the next open reads the new ones; a name longer than NAME_MAX is ENAMETOOLONG; a
truncate past the largest blob is EFBIG, and a sparse truncate takes no disk.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from datamount.storage import ObjectStore
from fuse_helpers import Mounts
from test_rw_mount import blob, env_for, mount_ok, runtime_log, unmount_ok

pytestmark = [pytest.mark.azurite, pytest.mark.fuse]


def keys(store: ObjectStore) -> list[str]:
    return sorted(o.key for page in store.list_pages("out/") for o in page.objects)


OLD = os.urandom(3 * 1024 * 1024 + 11)
NEW = os.urandom(1024 * 1024 + 5)


@pytest.fixture
def rw(azurite, container, tmp_path: Path, mounts: Mounts):  # noqa: ANN001, ANN201
    azurite.seed(container, {"out/ckpt.bin": OLD, "out/keep.txt": b"keep\n"})
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    yield mp
    unmount_ok(mounts, mp, env)


def test_temporary_file_unlinked_while_open_keeps_working(rw: Path, azure_store) -> None:  # noqa: ANN001
    with tempfile.TemporaryFile(dir=rw) as f:  # create + unlink at once
        f.write(b"scratch " * 1000)
        f.flush()
        st = os.fstat(f.fileno())
        assert (st.st_size, st.st_nlink) == (8000, 0)
        assert os.pread(f.fileno(), 7, 8) == b"scratch"
        f.seek(0)
        assert f.read() == b"scratch " * 1000
    assert sorted(os.listdir(rw)) == ["ckpt.bin", "keep.txt"]
    assert keys(azure_store) == ["out/ckpt.bin", "out/keep.txt"]


def test_a_stored_file_unlinked_while_open_serves_its_old_bytes(rw: Path, azure_store) -> None:  # noqa: ANN001
    fd = os.open(rw / "ckpt.bin", os.O_RDONLY)
    try:
        assert os.pread(fd, 10, 0) == OLD[:10]
        os.unlink(rw / "ckpt.bin")
        assert not (rw / "ckpt.bin").exists()
        st = os.fstat(fd)
        assert (st.st_size, st.st_nlink) == (len(OLD), 0)
        assert os.pread(fd, len(OLD) + 1, 0) == OLD
    finally:
        os.close(fd)
    assert not (rw / "ckpt.bin").exists()
    assert keys(azure_store) == ["out/keep.txt"]


def test_a_handle_on_a_renamed_file_reads_on(rw: Path, azure_store) -> None:  # noqa: ANN001
    fd = os.open(rw / "ckpt.bin", os.O_RDONLY)
    try:
        assert os.pread(fd, 5, 0) == OLD[:5]
        os.rename(rw / "ckpt.bin", rw / "moved.bin")
        assert os.pread(fd, len(OLD) + 1, 0) == OLD
        assert os.fstat(fd).st_size == len(OLD)
    finally:
        os.close(fd)
    assert blob(azure_store, "out/moved.bin") == OLD


def test_a_reader_of_a_file_replaced_by_rename_reads_the_old_bytes(
    rw: Path, azure_store: ObjectStore
) -> None:
    fd = os.open(rw / "ckpt.bin", os.O_RDONLY)
    try:
        assert os.pread(fd, 5, 0) == OLD[:5]
        (rw / "ckpt.tmp").write_bytes(NEW)
        os.rename(rw / "ckpt.tmp", rw / "ckpt.bin")
        assert (rw / "ckpt.bin").read_bytes() == NEW  # a new open: the new version
        assert os.pread(fd, len(OLD) + 1, 0) == OLD  # the old handle: the old one, whole
        assert os.fstat(fd).st_size == len(OLD)
    finally:
        os.close(fd)
    assert blob(azure_store, "out/ckpt.bin") == NEW
    assert keys(azure_store) == ["out/ckpt.bin", "out/keep.txt"]


def test_a_name_longer_than_name_max_is_enametoolong(rw: Path) -> None:
    long = "x" * 256
    for call in (os.stat, os.unlink, lambda p: os.open(p, os.O_RDONLY)):
        with pytest.raises(OSError) as caught:
            call(rw / long)
        assert caught.value.errno == errno.ENAMETOOLONG
    with pytest.raises(OSError) as caught:
        os.truncate(rw / long, 1)
    assert caught.value.errno == errno.ENAMETOOLONG


def test_truncate_past_the_largest_blob_is_efbig_and_a_sparse_one_takes_no_disk(
    rw: Path, azure_store: ObjectStore
) -> None:
    (rw / "s.bin").write_bytes(b"abc")
    with pytest.raises(OSError) as caught:
        os.truncate(rw / "s.bin", 999_999_999_999_999)
    assert caught.value.errno == errno.EFBIG
    assert os.stat(rw / "s.bin").st_size == 3
    free = os.statvfs(rw).f_bavail * os.statvfs(rw).f_frsize
    with open(rw / "s.bin", "r+b") as f:  # a hole larger than the free space
        f.truncate(free + (1 << 30))
        assert os.fstat(f.fileno()).st_size == free + (1 << 30)
        f.truncate(5)
    assert blob(azure_store, "out/s.bin") == b"abc\0\0"


def test_refused_links_and_special_files_log_one_warning_each(
    azurite,
    container,
    tmp_path: Path,
    mounts: Mounts,  # noqa: ANN001
) -> None:
    env = env_for(azurite, tmp_path, container)
    mp = mounts.point(tmp_path / "mnt")
    mount_ok(tmp_path, mp, env)
    (mp / "f").write_bytes(b"x")
    for i in range(5):
        with pytest.raises(OSError) as caught:
            os.symlink("f", mp / f"s{i}")
        assert caught.value.errno == errno.EPERM
        with pytest.raises(OSError) as caught:
            os.mkfifo(mp / f"p{i}")
        assert caught.value.errno == errno.EOPNOTSUPP
    unmount_ok(mounts, mp, env)
    log = runtime_log(mounts).splitlines()
    warnings = [line for line in log if " WARNING " in line and "refusals at DEBUG" in line]
    assert len(warnings) == 2, warnings  # symlink EPERM and mknod EOPNOTSUPP, once each


RENAME_NOREPLACE = 1  # <linux/fs.h>


def renameat2(old: Path, new: Path, flags: int) -> int:
    """renameat2(2) through libc (Python has no binding): 0 or the errno."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    done = libc.renameat2(at_fdcwd, os.fsencode(old), at_fdcwd, os.fsencode(new), flags)
    return 0 if done == 0 else ctypes.get_errno()


def test_inode_numbers_follow_names_and_the_native_loop_serves_writes(
    rw: Path, azure_store: ObjectStore, mounts: Mounts
) -> None:
    """rw_mount runs on the native loop: an inode number names one file while
    it is renamed, a new name gets a new number, an open file unlinked never
    shows its hidden name, and renameat2's flags are refused (a rename is copy
    + delete: it cannot promise no-replace or exchange)."""
    (rw / "a.txt").write_bytes(b"a")
    ino = os.stat(rw / "a.txt").st_ino
    os.rename(rw / "a.txt", rw / "b.txt")
    assert os.stat(rw / "b.txt").st_ino == ino
    (rw / "c.txt").write_bytes(b"c")
    assert os.stat(rw / "c.txt").st_ino not in (ino, os.stat(rw / "keep.txt").st_ino)
    with open(rw / "b.txt", "rb") as f:
        os.unlink(rw / "b.txt")
        assert sorted(os.listdir(rw)) == ["c.txt", "ckpt.bin", "keep.txt"]
        assert os.fstat(f.fileno()).st_ino == ino
        assert f.read() == b"a"
    assert renameat2(rw / "c.txt", rw / "d.txt", RENAME_NOREPLACE) == errno.EINVAL
    assert sorted(os.listdir(rw)) == ["c.txt", "ckpt.bin", "keep.txt"]
    assert keys(azure_store) == ["out/c.txt", "out/ckpt.bin", "out/keep.txt"]
    assert "FUSE init (native loop" in runtime_log(mounts)
