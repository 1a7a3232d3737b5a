"""Helpers for tests that make real FUSE mounts with the CLI.

`tracked_mounts` (the body of a `mounts` fixture) tracks every mount point a test uses and, whatever the
test's outcome, detaches what is still mounted (`fusermount3 -uz`) and kills
any daemon serving it, then fails the test if something had survived a
command that should have ended it. Daemons are found through their state file
and, as a fallback, through /proc (any process whose command line names the
mount point).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from datamount.mount.control import alive, find_mount, is_stale, read_state, stats_path

EXE = str(Path(sys.executable).parent / "datamount")
CLI_TIMEOUT = 60


def require_fuse() -> None:
    if not Path("/dev/fuse").exists() or not Path("/usr/bin/fusermount3").exists():
        pytest.fail("real FUSE is required: /dev/fuse and fusermount3 (apt-get install fuse3)")


def mount_env(azurite, tmp_path: Path, container: str, **extra: str) -> dict[str, str]:  # noqa: ANN001
    """The environment of a CLI run: a workspace with datastore `store` on
    `container`, the cache (and logs) under tmp_path, no ambient knobs."""
    ws = tmp_path / "ws.yaml"
    ws.write_text(
        "datastores:\n"
        f"  store: {{account_name: {azurite.account}, container_name: {container}, "
        f"endpoint: '{azurite.endpoint}', credentials: {{account_key: '${{TEST_KEY}}'}}}}\n"
    )
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATASET_", "RSLEX_", "DATAMOUNT_"))
    }
    return {**keep, "TEST_KEY": azurite.key, "DATAMOUNT_WORKSPACE": str(ws),
            "DATAMOUNT_CACHE_DIR": str(tmp_path / "cache"), **extra}  # fmt: skip


def spec_file(tmp_path: Path, name: str, type_: str, path: str) -> Path:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"type: {type_}\npath: {path}\nmode: ro_mount\n")
    return spec


def datamount(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EXE, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT
    )


def mounted(mountpoint: Path) -> bool:
    """In /proc/mounts (what the kernel has, whatever answers)."""
    key = os.path.abspath(mountpoint)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == key for line in f)


def daemons_of(mountpoint: Path) -> list[int]:
    """Pids of processes whose command line names `mountpoint` (daemons)."""
    key = os.path.abspath(mountpoint).encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            args = (proc / "cmdline").read_bytes().split(b"\0")
            if key in args and any(b"datamount" in a for a in args) and alive(int(proc.name)):
                pids.append(int(proc.name))
    return pids


def wait_for(predicate, timeout: float = 10.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


class Mounts:
    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self.points: list[Path] = []

    def point(self, path: Path) -> Path:
        """Register (and return) a mount point this test will use."""
        self.points.append(path)
        return path

    def daemon(self, mountpoint: Path) -> int:
        state = read_state(self.cache_dir, mountpoint)
        assert state is not None, f"no state file for {mountpoint}"
        return state.pid

    def stats(self, name: str = "input", mountpoint: Path | None = None) -> dict:
        """The stats file of entry `name`: of the mount at `mountpoint`, or the
        only one of that name (mount-stats-<name>-<hash of the mount point>.json)."""
        logs = self.cache_dir / "logs"
        if mountpoint is not None:
            return json.loads(stats_path(logs, name, mountpoint).read_text())
        found = list(logs.glob(f"mount-stats-{name}-*.json"))
        assert len(found) == 1, f"stats files of {name}: {found}"
        return json.loads(found[0].read_text())

    def cleanup(self) -> list[str]:
        """Detach and kill everything left; returns what had to be cleaned."""
        leftovers = []
        for mp in self.points:
            # A supervisor (mount.supervise) exits just after its daemon: not a leftover.
            wait_for(lambda m=mp: not daemons_of(m), 2)
            pids = set(daemons_of(mp))
            state = read_state(self.cache_dir, mp)
            if state is not None and alive(state.pid):
                pids.add(state.pid)
            if mounted(mp) or find_mount(mp) is not None or is_stale(mp):
                leftovers.append(f"{mp} still mounted")
                subprocess.run(["fusermount3", "-uz", str(mp)], capture_output=True)
            for pid in pids:
                leftovers.append(f"daemon {pid} of {mp} still running")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for pid in pids:
                wait_for(lambda p=pid: not alive(p), 5)
        return leftovers


def tracked_mounts(tmp_path: Path) -> Iterator[Mounts]:
    """The body of a `mounts` fixture (test modules wrap it in @pytest.fixture)."""
    require_fuse()
    tracker = Mounts(tmp_path / "cache")
    try:
        yield tracker
    finally:
        leftovers = tracker.cleanup()
    # Reached after a passing test body too: a command that should have ended
    # a mount or a daemon did not.
    if leftovers:
        pytest.fail("left behind: " + "; ".join(leftovers), pytrace=False)
