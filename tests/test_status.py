"""`datamount status`: mounts and upload outputs recorded on this node, checked
against the kernel's mount table and the process table (real FUSE, Azurite)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from datamount.mount.control import alive, read_state
from fuse_helpers import Mounts, datamount, mount_env, spec_file, wait_for

pytestmark = [pytest.mark.azurite, pytest.mark.fuse]


def status(env: dict[str, str]) -> list[dict]:
    out = datamount("status", "--json", env=env)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_status_lists_mounts_and_upload_outputs(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:
    container.upload_blob("ds/a.txt", b"alpha")
    env = mount_env(azurite, tmp_path, container.container_name)
    empty = datamount("status", env=env)
    assert empty.returncode == 0 and empty.stdout == "" and "nothing mounted" in empty.stderr

    mp = mounts.point(tmp_path / "mnt")
    spec = spec_file(tmp_path, "in", "uri_folder", "azureml://datastores/store/paths/ds/")
    assert datamount("mount", str(spec), str(mp), env=env).returncode == 0
    assert (mp / "a.txt").read_bytes() == b"alpha"
    out_spec = tmp_path / "out.yaml"
    out_spec.write_text(
        "outputs:\n  res: {mode: upload, path: azureml://datastores/store/paths/r/}\n"
    )
    assert datamount("mount", str(out_spec), str(tmp_path / "res"), env=env).returncode == 0

    pid = mounts.daemon(mp)
    entries = {e["mountpoint"]: e for e in status(env)}
    assert entries[str(mp)]["kind"] == "mount" and entries[str(mp)]["state"] == "serving"
    assert entries[str(mp)]["pid"] == pid
    assert entries[str(mp)]["uri"] == f"{azurite.endpoint}/{container.container_name}/ds/"
    upload = entries[str(tmp_path / "res")]
    assert (upload["kind"], upload["entry"]) == ("upload", "res")
    assert upload["state"].startswith("waiting for unmount")
    human = datamount("status", env=env).stdout
    assert f"{mp}: mount input, serving; pid {pid}" in human

    os.kill(pid, signal.SIGKILL)  # a crashed daemon leaves a stale mount behind
    assert wait_for(lambda: not alive(pid))
    # restarted in place by default (test_mount_heal.py): "restarting", then "serving"
    assert status(env)[0]["state"] in ("restarting (daemon killed by SIGKILL)", "serving")
    assert wait_for(lambda: status(env)[0]["state"] == "serving", 30)
    pid = mounts.daemon(mp)
    assert status(env)[0]["restarts"] == 1
    assert "; 1 restart; " in datamount("status", env=env).stdout
    os.kill(pid, signal.SIGKILL)  # unmount ends its supervisor (backing off or restarting)
    assert datamount("unmount", str(mp), env=env).returncode == 0
    assert datamount("unmount", str(tmp_path / "res"), env=env).returncode == 0
    assert status(env) == []


@pytest.mark.slow
def test_two_mounts_of_entries_with_the_same_name_keep_their_own_stats(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:
    """Every single-shape spec's entry is `input`: the stats file is named
    after the entry and the mount point, so two mounts never share one."""
    container.upload_blob("small/a.bin", b"a" * 1000)
    container.upload_blob("big/b.bin", os.urandom(3 << 20))
    env = mount_env(azurite, tmp_path, container.container_name)
    mp_a, mp_b = mounts.point(tmp_path / "a"), mounts.point(tmp_path / "b")
    for mp, folder in ((mp_a, "small"), (mp_b, "big")):
        spec = spec_file(
            tmp_path, folder, "uri_folder", f"azureml://datastores/store/paths/{folder}/"
        )
        out = datamount("mount", str(spec), str(mp), env=env)
        assert out.returncode == 0, out.stderr
    state_a, state_b = read_state(mounts.cache_dir, mp_a), read_state(mounts.cache_dir, mp_b)
    assert state_a is not None and state_b is not None
    assert state_a.stats_file != state_b.stats_file
    assert mounts.stats("input", mp_a)["mountpoint"] == str(mp_a)
    assert mounts.stats("input", mp_b)["mountpoint"] == str(mp_b)
    assert len((mp_b / "b.bin").read_bytes()) == 3 << 20

    def fetched() -> dict[str, int]:
        return {e["mountpoint"]: e["stats"].get("bytes_fetched", 0) for e in status(env)}

    # written every 5 s: b's numbers show up under b, and a's stay a's own
    assert wait_for(lambda: fetched()[str(mp_b)] >= 3 << 20, 15)
    assert fetched()[str(mp_a)] == 0
    for mp in (mp_a, mp_b):
        assert datamount("unmount", str(mp), env=env).returncode == 0
