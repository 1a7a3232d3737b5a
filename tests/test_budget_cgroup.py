"""The memory budget under a cgroup memory limit: parsing /proc/self/cgroup and
memory.max (v2) / memory.limit_in_bytes (v1) from fake cgroup folders, the
scaled areas, the start-up log line; and a real mount in a memory cgroup made
by hand (v1 or v2, root only) under heavy reads: not OOM-killed, right bytes."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from datamount.budget import (
    DEMAND,
    DISK_QUEUE,
    INTERPRETER_HEADROOM,
    PREFETCH,
    UPLOAD,
    cgroup_memory_limit,
    fit_limits,
)
from datamount.mount.stack import memory_budget
from datamount.settings import Settings
from fuse_helpers import EXE, Mounts, datamount, mount_env, spec_file

MIB = 1 << 20


def fake(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text + "\n")
    proc_file = tmp_path / "proc-self-cgroup"
    proc_file.write_text(proc)
    return root, proc_file


@pytest.mark.unit
def test_v2_memory_max_of_the_own_cgroup(tmp_path: Path) -> None:
    root, proc = fake(tmp_path, "0::/kubepods/pod1/c1\n", {
        "kubepods/pod1/c1/memory.max": str(512 * MIB),
        "kubepods/pod1/memory.max": "max",
        "kubepods/memory.max": "max",
    })  # fmt: skip
    assert cgroup_memory_limit(root, proc) == (512 * MIB, root / "kubepods/pod1/c1/memory.max")


@pytest.mark.unit
def test_v2_the_tightest_ancestor_wins_and_max_is_no_limit(tmp_path: Path) -> None:
    root, proc = fake(tmp_path, "0::/a/b\n", {
        "a/b/memory.max": "max", "a/memory.max": str(300 * MIB), "memory.max": str(900 * MIB),
    })  # fmt: skip
    assert cgroup_memory_limit(root, proc) == (300 * MIB, root / "a/memory.max")
    root, proc = fake(tmp_path / "none", "0::/\n", {"memory.max": "max"})
    assert cgroup_memory_limit(root, proc) is None


@pytest.mark.unit
def test_v1_memory_limit_in_bytes_and_its_unlimited_value(tmp_path: Path) -> None:
    proc_text = "12:pids:/x\n4:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/\n"
    root, proc = fake(tmp_path, proc_text, {
        "memory/docker/abc/memory.limit_in_bytes": str(256 * MIB),
        "memory/docker/memory.limit_in_bytes": "9223372036854771712",
        "memory/memory.limit_in_bytes": "9223372036854771712",
    })  # fmt: skip
    found = cgroup_memory_limit(root, proc)
    assert found == (256 * MIB, root / "memory/docker/abc/memory.limit_in_bytes")
    root, proc = fake(tmp_path / "u", "4:cpu,memory:/\n", {
        "memory/memory.limit_in_bytes": "9223372036854771712",
    })  # fmt: skip
    assert cgroup_memory_limit(root, proc) is None


@pytest.mark.unit
def test_no_cgroup_files_mean_no_limit(tmp_path: Path) -> None:
    assert cgroup_memory_limit(tmp_path, tmp_path / "missing") is None
    root, proc = fake(tmp_path, "0::/a\n", {})
    assert cgroup_memory_limit(root, proc) is None
    root, proc = fake(tmp_path / "bad", "0::/\n", {"memory.max": "lots"})
    assert cgroup_memory_limit(root, proc) is None


@pytest.mark.unit
def test_fit_limits_scales_every_area_and_keeps_the_floors() -> None:
    limits = {PREFETCH: 64 * MIB, DEMAND: 0, DISK_QUEUE: 512 * MIB, UPLOAD: 128 * MIB}
    assert fit_limits(limits, 1024 * MIB, {}) == limits
    half = fit_limits(limits, 352 * MIB, {})
    assert half == {PREFETCH: 32 * MIB, DEMAND: 0, DISK_QUEUE: 256 * MIB, UPLOAD: 64 * MIB}
    floors = {PREFETCH: 2 * MIB, DISK_QUEUE: 2 * MIB, UPLOAD: 8 * MIB}
    tiny = fit_limits(limits, 1 * MIB, floors)
    assert tiny == {PREFETCH: 2 * MIB, DEMAND: 0, DISK_QUEUE: 2 * MIB, UPLOAD: 8 * MIB}


@pytest.mark.unit
def test_the_budget_fits_the_container_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings.from_env({}, cpu_count=2)  # 704 MiB with uploads, RAM tier 128 MiB
    source = Path("/sys/fs/cgroup/memory.max")
    with caplog.at_level(logging.INFO, logger="datamount.readstack"):
        budget = memory_budget(settings, uploads=True, cgroup=(768 * MIB, source))
    room = 768 * MIB - 128 * MIB - INTERPRETER_HEADROOM
    assert budget.total <= room and budget.total > room - 4
    assert budget.limits[UPLOAD] >= 8 * MIB and budget.limits[DEMAND] == 0
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"budget {budget.total / MIB:g} MiB instead of 704 MiB: ")
    assert f"{source} limits memory to 768 MiB" in line
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="datamount.readstack"):
        assert memory_budget(settings, uploads=True, cgroup=(8 << 30, source)).total == 704 * MIB
        assert memory_budget(settings, uploads=True, cgroup=None).total == 704 * MIB
    assert [r.getMessage() for r in caplog.records] == [
        f"budget 704 MiB fits the cgroup memory limit 8192 MiB ({source})",
        "no cgroup memory limit: the budget is 704 MiB",
    ]


# -- a real memory cgroup ------------------------------------------------------------------


def _make_cgroup(limit: int) -> tuple[Path, Path, Path]:
    """A memory cgroup of `limit` bytes under this process's own (v1 or v2):
    (folder, file to write pids to, file counting OOM kills)."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup needs root")
    name = f"datamount-test-{uuid.uuid4().hex[:8]}"
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            folder = Path("/sys/fs/cgroup/memory") / path.strip("/") / name
            limit_file, events = "memory.limit_in_bytes", "memory.oom_control"
            break
    else:
        base = Path("/sys/fs/cgroup") / Path("/proc/self/cgroup").read_text().split("::", 1)[-1]
        base = Path(str(base).strip())
        if "memory" not in (base / "cgroup.subtree_control").read_text():
            pytest.skip(f"cgroup v2 without the memory controller delegated at {base}")
        folder, limit_file, events = base / name, "memory.max", "memory.events"
    try:
        folder.mkdir()
        (folder / limit_file).write_text(str(limit))
    except OSError as exc:
        with contextlib.suppress(OSError):
            folder.rmdir()
        pytest.skip(f"cannot make a memory cgroup at {folder}: {exc}")
    return folder, folder / "cgroup.procs", folder / events


@pytest.mark.slow
@pytest.mark.fuse
def test_a_mount_in_a_small_memory_cgroup_serves_heavy_reads(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:
    limit = 360 * MIB
    folder, procs, events = _make_cgroup(limit)
    try:
        bodies = {f"f{i}.bin": os.urandom(48 * MIB) for i in range(4)}
        for name, body in bodies.items():
            container.upload_blob(f"ds/{name}", body)
        env = mount_env(azurite, tmp_path, container.container_name,
                        DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT="256")  # fmt: skip
        mp = mounts.point(tmp_path / "mnt")
        spec = spec_file(tmp_path, "in", "uri_folder", "azureml://datastores/store/paths/ds/")
        # The CLI joins the cgroup before it spawns the daemon: the daemon inherits it.
        out = subprocess.run(
            ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", EXE, "mount", str(spec),
             str(mp)], env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        pid = mounts.daemon(mp)
        assert str(pid) in procs.read_text().split()
        for name, body in bodies.items():  # 192 MiB through a daemon capped at 360 MiB
            digest = hashlib.sha256((mp / name).read_bytes()).hexdigest()
            assert digest == hashlib.sha256(body).hexdigest(), name
        assert mounts.daemon(mp) == pid  # the same daemon, alive
        log = (mounts.cache_dir / "logs").glob("*.log")
        text = "\n".join(p.read_text(errors="replace") for p in log)
        assert "limits memory to 360 MiB" in text
        kills = [ln for ln in events.read_text().splitlines() if ln.startswith("oom_kill ")]
        assert kills in ([], ["oom_kill 0"])
        assert datamount("unmount", str(mp), env=env).returncode == 0
    finally:
        with contextlib.suppress(OSError):
            folder.rmdir()
