"""Who reads a mount, and who reads the cache: real mounts by root, read by
the real unprivileged user nobody (65534) through `setpriv`.

The mount point and the cache live in a folder of their own under /tmp,
mode 0711, so that nobody can walk to them: pytest's tmp_path is under
/tmp/pytest-of-root (0700), which would refuse nobody whatever the mount
allows. What is measured is the mount's access and the cache's modes.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from datamount.fs.access import mount_access
from datamount.mount.control import alive
from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file, tracked_mounts, wait_for

NOBODY = 65534
BODY = b"private bytes\n" * 1000
TREE = {"ds/a.txt": BODY, "ds/sub/b.txt": b"b"}
OTHER_GID = 12345  # not nobody's group


def as_nobody(*argv: str) -> subprocess.CompletedProcess[bytes]:
    """`argv` run as the unprivileged user nobody, no supplementary groups."""
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        capture_output=True,
        timeout=30,
    )


def nobody_reads(path: Path) -> bytes | None:
    """The bytes nobody reads at `path`, or None when refused."""
    out = as_nobody("cat", str(path))
    if out.returncode != 0:
        assert b"Permission denied" in out.stderr, out.stderr
        return None
    return out.stdout


def nobody_lists(path: Path) -> list[str] | None:
    out = as_nobody("ls", "-1", str(path))
    if out.returncode != 0:
        assert b"Permission denied" in out.stderr, out.stderr
        return None
    return sorted(out.stdout.decode().split())


@pytest.fixture
def shared() -> Iterator[Path]:
    """A 0711 folder under /tmp: nobody may walk through it, not list it."""
    folder = Path(tempfile.mkdtemp(prefix="datamount-access-", dir="/tmp"))
    os.chmod(folder, 0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def shared_mounts(shared: Path) -> Iterator[Mounts]:
    """The `mounts` fixture, with the cache at shared/cache."""
    yield from tracked_mounts(shared)


def setup(azurite, container, tmp_path: Path, shared: Path, **extra: str) -> dict[str, str]:  # noqa: ANN001
    azurite.seed(container, TREE)
    return mount_env(azurite, tmp_path, container.container_name,
                     DATAMOUNT_CACHE_DIR=str(shared / "cache"), **extra)  # fmt: skip


def mount(spec: Path, mp: Path, env: dict[str, str]) -> None:
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert mounted(mp)


def unmount(mounts: Mounts, mp: Path, env: dict[str, str]) -> None:
    """Unmount and wait for the daemon to end (its last log and stats lines)."""
    pid = mounts.daemon(mp)
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert not mounted(mp)
    assert wait_for(lambda: not alive(pid)), f"daemon {pid} still running"


def folder_spec(tmp_path: Path) -> Path:
    return spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ds/")


def output_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "outputs:\n"
        "  model: {type: uri_folder, path: 'azureml://datastores/store/paths/ds/', "
        "mode: rw_mount}\n"
    )
    return spec


def open_entries(cache: Path) -> list[str]:
    """Every folder and file under `cache` (and itself) with a group or other bit."""
    found = []
    for path in [cache, *cache.rglob("*")]:
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            continue
        if mode & 0o077:
            found.append(f"{path.relative_to(cache.parent)} {stat.S_IMODE(mode):04o}")
    return found


def runtime_log(shared: Path) -> str:
    return (shared / "cache" / "logs" / "datamount-runtime.log").read_text()


# -- the access value --------------------------------------------------------


@pytest.mark.unit
def test_access_defaults_options_and_log_line() -> None:
    ro = mount_access(writable=False)
    assert (ro.uid, ro.gid) == (os.geteuid(), os.getegid())
    assert (ro.file_mode, ro.dir_mode, ro.fuse_options()) == (0o444, 0o555, {})
    rw = mount_access(writable=True)
    assert (rw.file_mode, rw.dir_mode) == (0o755, 0o755)
    assert ro.describe() == (
        f"owner {os.geteuid()}:{os.getegid()}, files 0444, folders 0555, only the mounting user"
    )
    opened = mount_access(writable=False, allow_other=True, uid=7, gid=8, file_mode=0o440)
    assert opened.fuse_options() == {"allow_other": True, "default_permissions": True}
    assert opened.describe() == (
        "owner 7:8, files 0440, folders 0555, allow_other (default_permissions)"
    )


# -- real mounts, read by nobody ----------------------------------------------------


@pytest.mark.fuse
def test_default_mount_is_for_the_mounting_user_only(
    azurite, container, tmp_path: Path, shared: Path, shared_mounts: Mounts
) -> None:  # noqa: ANN001
    env = setup(azurite, container, tmp_path, shared)
    mp = shared_mounts.point(shared / "mnt")
    mount(folder_spec(tmp_path), mp, env)
    assert (mp / "a.txt").read_bytes() == BODY  # root reads (and fills the cache)
    info = os.stat(mp / "a.txt")
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o444, 0, 0)
    assert nobody_reads(mp / "a.txt") is None
    assert nobody_lists(mp) is None
    assert nobody_lists(shared / "cache") is None
    assert nobody_reads(shared / "cache" / "logs" / "datamount-runtime.log") is None
    assert "access: owner 0:0, files 0444, folders 0555, only the mounting user" in runtime_log(
        shared
    )
    unmount(shared_mounts, mp, env)
    assert list((shared / "cache" / "blocks").rglob("*.blk"))  # the read left blocks
    assert open_entries(shared / "cache") == []


@pytest.mark.fuse
def test_allow_other_with_default_modes_lets_nobody_read(
    azurite, container, tmp_path: Path, shared: Path, shared_mounts: Mounts
) -> None:  # noqa: ANN001
    env = setup(azurite, container, tmp_path, shared, DATAMOUNT_MOUNT_ALLOW_OTHER="true")
    mp = shared_mounts.point(shared / "mnt")
    mount(folder_spec(tmp_path), mp, env)
    assert nobody_reads(mp / "a.txt") == BODY
    assert nobody_reads(mp / "sub" / "b.txt") == b"b"
    assert nobody_lists(mp) == ["a.txt", "sub"]
    assert nobody_lists(shared / "cache") is None  # the mount is open, the cache is not
    assert "files 0444, folders 0555, allow_other (default_permissions)" in runtime_log(shared)
    mounts_now = Path("/proc/mounts").read_text().splitlines()
    options = next(line for line in mounts_now if f" {mp} " in line).split()[3].split(",")
    assert "default_permissions" in options and "allow_other" in options
    unmount(shared_mounts, mp, env)
    assert open_entries(shared / "cache") == []


@pytest.mark.fuse
def test_file_mode_0440_of_another_group_refuses_nobody(
    azurite, container, tmp_path: Path, shared: Path, shared_mounts: Mounts
) -> None:  # noqa: ANN001
    env = setup(azurite, container, tmp_path, shared, DATAMOUNT_MOUNT_ALLOW_OTHER="1",
                DATAMOUNT_MOUNT_FILE_MODE="0440", DATAMOUNT_MOUNT_GID=str(OTHER_GID))  # fmt: skip
    mp = shared_mounts.point(shared / "mnt")
    mount(folder_spec(tmp_path), mp, env)
    info = os.stat(mp / "a.txt")
    assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o440, 0, OTHER_GID)
    assert nobody_lists(mp) == ["a.txt", "sub"]  # folders stay 0555
    assert nobody_reads(mp / "a.txt") is None  # the kernel checks the mode: default_permissions
    assert (mp / "a.txt").read_bytes() == BODY  # root still reads
    unmount(shared_mounts, mp, env)


@pytest.mark.fuse
def test_owner_nobody_with_mode_0400_lets_nobody_read(
    azurite, container, tmp_path: Path, shared: Path, shared_mounts: Mounts
) -> None:  # noqa: ANN001
    env = setup(azurite, container, tmp_path, shared, DATAMOUNT_MOUNT_ALLOW_OTHER="true",
                DATAMOUNT_MOUNT_UID=str(NOBODY), DATAMOUNT_MOUNT_FILE_MODE="0400",
                DATAMOUNT_MOUNT_DIR_MODE="0500")  # fmt: skip
    mp = shared_mounts.point(shared / "mnt")
    mount(folder_spec(tmp_path), mp, env)
    info = os.stat(mp / "a.txt")
    assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o400, NOBODY)
    assert stat.S_IMODE(os.stat(mp / "sub").st_mode) == 0o500
    assert nobody_reads(mp / "a.txt") == BODY
    assert nobody_lists(mp / "sub") == ["b.txt"]
    assert f"access: owner {NOBODY}:0, files 0400, folders 0500, allow_other" in runtime_log(shared)
    unmount(shared_mounts, mp, env)


@pytest.mark.fuse
def test_rw_mount_default_modes_and_what_nobody_may_do(
    azurite, container, tmp_path: Path, shared: Path, shared_mounts: Mounts
) -> None:  # noqa: ANN001
    env = setup(azurite, container, tmp_path, shared, DATAMOUNT_MOUNT_ALLOW_OTHER="true")
    mp = shared_mounts.point(shared / "mnt")
    mount(output_spec(tmp_path), mp, env)
    (mp / "new.txt").write_bytes(b"written by root")
    os.mkdir(mp / "made")
    assert stat.S_IMODE(os.stat(mp / "new.txt").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(mp / "a.txt").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(mp / "made").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(mp).st_mode) == 0o755
    assert nobody_reads(mp / "new.txt") == b"written by root"
    # 0755 / 0755 of root: nobody reads, but neither writes nor creates
    wrote = as_nobody("sh", "-c", f"echo x >> '{mp / 'new.txt'}'")
    assert wrote.returncode != 0 and b"Permission denied" in wrote.stderr
    made = as_nobody("touch", str(mp / "by-nobody.txt"))
    assert made.returncode != 0 and b"Permission denied" in made.stderr
    assert "files 0755, folders 0755, allow_other (default_permissions)" in runtime_log(shared)
    unmount(shared_mounts, mp, env)
    assert container.download_blob("ds/new.txt").readall() == b"written by root"
    assert open_entries(shared / "cache") == []  # staging and journal too


@pytest.mark.fuse
def test_rw_mount_by_default_refuses_nobody(
    azurite, container, tmp_path: Path, shared: Path, shared_mounts: Mounts
) -> None:  # noqa: ANN001
    env = setup(azurite, container, tmp_path, shared)
    mp = shared_mounts.point(shared / "mnt")
    mount(output_spec(tmp_path), mp, env)
    (mp / "new.txt").write_bytes(b"root's")
    assert nobody_reads(mp / "new.txt") is None
    assert nobody_lists(mp) is None
    unmount(shared_mounts, mp, env)
    assert open_entries(shared / "cache") == []


@pytest.mark.fuse
def test_whole_file_cache_is_private(
    azurite, container, tmp_path: Path, shared: Path, shared_mounts: Mounts
) -> None:  # noqa: ANN001
    big = os.urandom((8 << 20) + 4097)  # past one range: through the Downloader
    azurite.seed(container, {"ds/big.bin": big})
    env = setup(azurite, container, tmp_path, shared,
                DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED="false")  # fmt: skip
    mp = shared_mounts.point(shared / "mnt")
    mount(folder_spec(tmp_path), mp, env)
    assert (mp / "a.txt").read_bytes() == BODY
    assert (mp / "big.bin").read_bytes() == big
    unmount(shared_mounts, mp, env)
    copies = sorted(p.stat().st_size for p in (shared / "cache" / "files").rglob("*-*"))
    assert copies == [len(BODY), len(big)]
    assert open_entries(shared / "cache") == []
