"""`datamount status --ready MOUNTPOINT`, a container's startup/readiness
probe: exit 0 while a datamount mount there answers, 1 (one line) for a path
that is not mounted, another filesystem, a stale mount or a hung daemon
(real FUSE over Azurite)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from datamount.cli import status
from datamount.mount.control import alive
from fuse_helpers import Mounts, datamount, mount_env, spec_file, wait_for

pytestmark = [pytest.mark.azurite, pytest.mark.fuse]


def ready(mp: Path, env: dict[str, str]) -> tuple[int, str]:
    out = datamount("status", "--ready", str(mp), env=env)
    return out.returncode, (out.stdout + out.stderr).strip()


@pytest.mark.slow
def test_ready_while_mounted_not_after_unmount_nor_elsewhere(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:
    container.upload_blob("ds/a.txt", b"alpha")
    env = mount_env(azurite, tmp_path, container.container_name)
    mp = mounts.point(tmp_path / "mnt")
    plain = tmp_path / "plain"
    plain.mkdir()
    assert ready(plain, env) == (1, f"datamount: error: {plain}: not ready: not mounted")
    assert ready(tmp_path / "missing", env)[0] == 1
    assert ready(Path("/proc"), env) == (
        1, "datamount: error: /proc: not ready: not a datamount mount (proc)"
    )  # fmt: skip

    spec = spec_file(tmp_path, "in", "uri_folder", "azureml://datastores/store/paths/ds/")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert ready(mp, env) == (0, f"{mp}: ready")
    assert (mp / "a.txt").read_bytes() == b"alpha"

    assert datamount("unmount", str(mp), env=env).returncode == 0
    assert ready(mp, env) == (1, f"datamount: error: {mp}: not ready: not mounted")


def test_a_stale_mount_is_not_ready(azurite, container, tmp_path: Path, mounts: Mounts) -> None:
    container.upload_blob("ds/a.txt", b"alpha")
    env = mount_env(azurite, tmp_path, container.container_name)
    mp = mounts.point(tmp_path / "mnt")
    spec = spec_file(tmp_path, "in", "uri_folder", "azureml://datastores/store/paths/ds/")
    assert datamount("mount", str(spec), str(mp), env=env).returncode == 0
    pid = mounts.daemon(mp)
    os.kill(pid, signal.SIGKILL)  # the mount stays in the table, nothing answers
    assert wait_for(lambda: not alive(pid))
    code, line = ready(mp, env)
    assert code == 1 and line.startswith(f"datamount: error: {mp}: not ready: does not answer: ")
    assert datamount("unmount", str(mp), env=env).returncode == 0  # clears the stale mount


def test_a_hung_daemon_fails_the_probe_within_its_timeout(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:
    container.upload_blob("ds/a.txt", b"alpha")
    env = mount_env(azurite, tmp_path, container.container_name)
    mp = mounts.point(tmp_path / "mnt")
    spec = spec_file(tmp_path, "in", "uri_folder", "azureml://datastores/store/paths/ds/")
    assert datamount("mount", str(spec), str(mp), env=env).returncode == 0
    pid = mounts.daemon(mp)
    os.kill(pid, signal.SIGSTOP)  # mounted, alive, answers nothing
    try:
        start = time.monotonic()
        assert status.ready(mp, timeout=0.5) == "no answer within 0.5 s"
        assert time.monotonic() - start < 2.0
    finally:
        os.kill(pid, signal.SIGCONT)
    assert status.ready(mp) is None
    assert datamount("unmount", str(mp), env=env).returncode == 0
