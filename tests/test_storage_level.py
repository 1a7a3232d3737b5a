"""DATAMOUNT_STORAGE_LEVEL: each level's DATASET_MOUNT_* values, explicit
variables winning, the one-line error, and one real ro_mount per level over
Azurite whose counters and cache folder show the tier that served re-reads.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from datamount.errors import SettingsError
from datamount.settings import GB, MB, STORAGE_LEVELS, Settings, storage_level_line
from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file, wait_for

EXPECTED = {  # (block mode, RAM tier bytes, disk tier)
    "memory": (True, 1 * GB, False),
    "memory_disk": (True, 128 * MB, True),
    "disk": (True, 0, True),
}


def effective(s: Settings) -> tuple[bool, int, bool]:
    return s.block_based_cache_enabled, s.memory_cache_size, s.block_file_cache_enabled


@pytest.mark.unit
@pytest.mark.parametrize("level", sorted(EXPECTED))
def test_each_level_sets_its_values(level: str) -> None:
    s = Settings.from_env({"DATAMOUNT_STORAGE_LEVEL": level})
    assert s.storage_level == level
    assert effective(s) == EXPECTED[level]
    line = storage_level_line(s)
    assert line is not None and line.startswith(f"storage level {level}: ")
    assert "explicit" not in line
    assert sorted(STORAGE_LEVELS) == sorted(EXPECTED)


@pytest.mark.unit
def test_no_level_keeps_the_defaults() -> None:
    s = Settings.from_env({})
    assert s.storage_level is None and storage_level_line(s) is None
    assert effective(s) == (True, 128 * MB, True)
    assert "DATAMOUNT_STORAGE_LEVEL=unset" in s.describe()


@pytest.mark.unit
def test_an_explicit_variable_wins_over_the_level() -> None:
    s = Settings.from_env(
        {
            "DATAMOUNT_STORAGE_LEVEL": " Memory ",
            "DATASET_MOUNT_MEMORY_CACHE_SIZE": "64MB",
            "DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED": "false",
        }
    )
    assert effective(s) == (False, 64 * MB, False)
    line = storage_level_line(s)
    assert line == (
        "storage level memory: DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED=false "
        "(explicit, wins over the level: DATASET_MOUNT_BLOCK_BASED_CACHE_ENABLED=false "
        "DATASET_MOUNT_MEMORY_CACHE_SIZE=64MB)"
    )
    # An override (a CLI flag, by field name) wins too.
    s = Settings.from_env({"DATAMOUNT_STORAGE_LEVEL": "disk"}, memory_cache_size=MB)
    assert effective(s) == (True, MB, True)


@pytest.mark.unit
def test_a_level_survives_the_plan_round_trip() -> None:
    s = Settings.from_env(
        {"DATAMOUNT_STORAGE_LEVEL": "disk", "DATASET_MOUNT_MEMORY_CACHE_SIZE": "2MB"}
    )
    again = Settings.model_validate(s.model_dump(mode="json"))
    assert again == s


@pytest.mark.unit
@pytest.mark.parametrize("bad", ["fast", "ram", "memory,disk"])
def test_a_bad_level_is_one_line(bad: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"DATAMOUNT_STORAGE_LEVEL": bad})
    assert str(info.value).count("\n") == 0
    assert f"DATAMOUNT_STORAGE_LEVEL={bad!r}: not a storage level" in str(info.value)
    assert info.value.exit_code == 2


# -- real mounts ---------------------------------------------------------------

BS = 64 * 1024


def read_direct(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        parts, offset = [], 0
        while data := os.pread(fd, 4 * BS, offset):
            parts.append(data)
            offset += len(data)
        return b"".join(parts)
    finally:
        os.close(fd)


def block_files(cache: Path) -> list[Path]:
    return [p for p in (cache / "blocks").rglob("*.blk") if p.parent.name != "tmp"]


def test_the_cli_refuses_a_bad_level(azurite, container, tmp_path: Path) -> None:  # noqa: ANN001
    env = mount_env(azurite, tmp_path, container.container_name, DATAMOUNT_STORAGE_LEVEL="fast")
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ds/")
    out = datamount("mount", str(spec), str(tmp_path / "mnt"), env=env)
    assert out.returncode == 2
    assert "DATAMOUNT_STORAGE_LEVEL='fast': not a storage level" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.fuse
@pytest.mark.parametrize("level", sorted(EXPECTED))
def test_ro_mount_per_level(azurite, container, tmp_path: Path, mounts: Mounts, level: str) -> None:  # noqa: ANN001
    body = random.Random(level).randbytes(16 * BS + 100)  # 17 blocks
    n = -(-len(body) // BS)
    azurite.seed(container, {"ds/f.bin": body})
    env = mount_env(
        azurite, tmp_path, container.container_name,
        DATAMOUNT_STORAGE_LEVEL=level, DATASET_MOUNT_READ_BLOCK_SIZE="64KB",
        DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT="0",
    )  # fmt: skip
    cache = tmp_path / "cache"
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ds/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert mounted(mp)
    _, ram, disk = EXPECTED[level]

    assert read_direct(mp / "f.bin") == body
    if disk:
        assert wait_for(lambda: len(block_files(cache)) == n), len(block_files(cache))
    assert read_direct(mp / "f.bin") == body  # a new O_DIRECT handle: the daemon answers
    pid = mounts.daemon(mp)
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert wait_for(lambda: not mounted(mp))
    from datamount.mount.control import alive

    assert wait_for(lambda: not alive(pid))
    everything = mounts.stats("input", mp)
    stats = everything["cache"]

    assert len(block_files(cache)) == (n if disk else 0)
    assert stats["bytes_fetched"] == len(body)  # the re-read came from a tier
    if disk:  # every block on disk at the open: the native loop reads the block files
        assert everything["fs"]["native_read_bytes"] == len(body)
        assert stats["ram_hits"] == stats["disk_hits"] == 0
    else:  # the RAM tier alone ("memory")
        assert ram and stats["ram_hits"] >= n - 1 and stats["disk_hits"] == 0
    runtime = (cache / "logs" / "datamount-runtime.log").read_text()
    line = storage_level_line(Settings.from_env({"DATAMOUNT_STORAGE_LEVEL": level}))
    assert line is not None and line in runtime
    assert f"DATAMOUNT_STORAGE_LEVEL={level}" in runtime
