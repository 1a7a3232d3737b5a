"""FUSE round trips per small file on a real ro_mount over Azurite, counted by
the daemon's own FUSE timing (the metrics endpoint): a close(2) sends no
FLUSH to a read-only mount, and a 256 KiB file is one read request, whether
Python or the native loop serves it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fuse_helpers import Mounts, datamount, wait_for
from test_metrics import mount_with_metrics, scrape, status_json

pytestmark = [pytest.mark.azurite, pytest.mark.fuse]

FILES = 12
SIZE = 256 * 1024


def test_a_small_file_costs_lookup_open_read_release(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:
    data = {f"d/f{i:02d}.bin": os.urandom(SIZE) for i in range(FILES)}
    for name, body in data.items():
        container.upload_blob(f"ds/{name}", body)
    env, mp = mount_with_metrics(azurite, container, tmp_path, mounts)
    (entry,) = status_json(env)
    url = entry["metrics_url"]
    for name, body in data.items():
        with open(mp / name, "rb", buffering=0) as f:
            assert f.read() == body
    # close(2) returns before the kernel's RELEASE reaches the daemon: wait for it
    assert wait_for(lambda: scrape(url)[("datamount_open_handles", ())] == 0)
    after = scrape(url)

    def calls(op: str) -> float:  # the requests that reached Python
        return after.get(("datamount_fuse_operation_seconds_count", (("op", op),)), 0.0)

    def served(op: str) -> float:  # all of them, the native loop's included
        return after[("datamount_fuse_operations_total", (("op", op),))]

    assert served("opens") == FILES
    assert served("reads") <= FILES + 1  # one read of 256 KiB each (at most one extra)
    # From the 4th file on, the file-ahead prefetch may have put the file on
    # disk before its open: the native loop opens, reads and releases it.
    assert 3 <= calls("open") <= FILES
    assert calls("release") == calls("open")
    assert calls("read_into") <= calls("open") + 1
    assert calls("flush") == 0  # left out of libfuse's table: the kernel stopped asking
    assert calls("getattr") <= FILES + 2  # a lookup per file, the folder's, the root's
    assert datamount("unmount", str(mp), env=env).returncode == 0
