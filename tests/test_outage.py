"""Storage unreachable for 8 s in the middle of a download and of a mount
read, 10 times: every run ends with the source's exact bytes, with the
default retry settings (7 retries, a 90 s budget).

The outage is real at the TCP level: a FaultProxy in front of Azurite closes
its listening socket (connections are refused) and resets every open
connection, then listens again on the same port (`FaultProxy.outage`). Each
outage hits a `datamount download` of one 48 MiB blob (4 workers, ranges in
flight) and, at the same time, a read through a ro_mount that has read the
first MiB of a fresh file and needs the rest (no prefetch: each block is
fetched when it is read).
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from datamount.mount.control import alive
from faultproxy import FaultProxy
from fuse_helpers import (
    EXE,
    Mounts,
    datamount,
    mount_env,
    mounted,
    spec_file,
    tracked_mounts,
    wait_for,
)

pytestmark = [pytest.mark.azurite, pytest.mark.fuse, pytest.mark.slow]

OUTAGE = 8.0
RUNS = 10
MIB = 1024 * 1024
rng = random.Random(20261202)
DOWNLOAD = rng.randbytes(48 * MIB)
READS = [rng.randbytes(6 * MIB + i * 4099) for i in range(RUNS)]
MOUNT_ENV = {"DATASET_MOUNT_READ_BLOCK_SIZE": "1MB", "DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "0"}


class CountingProxy(FaultProxy):
    """A FaultProxy that also counts the ranged GETs it was asked for, by
    blob name, as their heads arrive (FaultProxy records answers only)."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__(upstream_port)
        self.started: collections.Counter[str] = collections.Counter()

    def _rule(self, head):  # noqa: ANN001, ANN202
        if head.first.startswith(b"GET ") and (head.get("x-ms-range") or head.get("range")):
            path = head.first.split()[1].split(b"?")[0].decode()
            with self._lock:
                self.started[path.rsplit("/", 1)[-1]] += 1
        return super()._rule(head)

    def count(self, blob: str) -> int:
        with self._lock:
            return self.started[blob]


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[Mounts]:
    yield from tracked_mounts(tmp_path)


@pytest.fixture
def outage_proxy(azurite) -> Iterator[CountingProxy]:  # noqa: ANN001
    proxy = CountingProxy(azurite.port)
    try:
        yield proxy
    finally:
        proxy.close()


class Reader(threading.Thread):
    """Reads a file of the mount through O_DIRECT (every byte from the
    daemon): its first MiB, then waits for `go`, then the rest."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.primed = threading.Event()
        self.go = threading.Event()
        self.data = b""
        self.error: BaseException | None = None

    def run(self) -> None:
        parts: list[bytes] = []
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
            try:
                parts.append(os.pread(fd, MIB, 0))
                self.primed.set()
                self.go.wait(60)
                offset = len(parts[0])
                while chunk := os.pread(fd, MIB, offset):
                    parts.append(chunk)
                    offset += len(chunk)
            finally:
                os.close(fd)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.primed.set()
            self.data = b"".join(parts)


def start_download(dest: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    source = "azureml://datastores/store/paths/dl/big.bin"
    return subprocess.Popen(
        [EXE, "download", source, str(dest)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def one_run(
    run: int, proxy: CountingProxy, mp: Path, tmp_path: Path, env: dict[str, str]
) -> tuple[str, int]:
    """One outage under a download and a mount read; the download's stderr
    and the ranged GETs it made."""
    dest = tmp_path / f"dl{run}"
    before = proxy.count("big.bin")
    reader = Reader(mp / f"r{run}.bin")
    reader.start()
    proc = start_download(dest, env)
    try:
        assert reader.primed.wait(30) and reader.error is None, reader.error
        # Two ranges asked for: the download is in flight when storage goes.
        assert wait_for(lambda: proxy.count("big.bin") >= before + 2, 60), "no ranged GET"
        proxy.down()
        try:
            reader.go.set()
            time.sleep(OUTAGE)
        finally:
            proxy.up()
        _, stderr = proc.communicate(timeout=120)
        reader.join(120)
    finally:
        reader.go.set()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert (dest / "big.bin").read_bytes() == DOWNLOAD, f"run {run}: download differs"
    shutil.rmtree(dest)
    assert not reader.is_alive() and reader.error is None, reader.error
    assert reader.data == READS[run], f"run {run}: mount read differs"
    return stderr, proxy.count("big.bin") - before


def test_an_8s_outage_under_a_download_and_a_mount_read_is_ridden_out_10_times(
    azurite, container, tmp_path: Path, mounts: Mounts, outage_proxy: CountingProxy
) -> None:  # noqa: ANN001
    azurite.seed(container, {"dl/big.bin": DOWNLOAD, **{f"rd/r{i}.bin": b for i, b in
                                                         enumerate(READS)}})  # fmt: skip
    via = SimpleNamespace(account=azurite.account, key=azurite.key, endpoint=outage_proxy.endpoint)
    env = mount_env(via, tmp_path, container.container_name, RSLEX_DOWNLOADER_THREADS="4")
    mp = mounts.point(tmp_path / "mnt")
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/rd/")
    out = datamount("mount", str(spec), str(mp), env={**env, **MOUNT_ENV})
    assert out.returncode == 0, out.stderr
    pid = mounts.daemon(mp)
    # Every request held 0.25 s: the download's first ranges are still in
    # flight when storage goes, however fast the machine serves the rest.
    outage_proxy.latency(0.25)
    for run in range(RUNS):
        stderr, gets = one_run(run, outage_proxy, mp, tmp_path, env)
        assert "datamount: downloaded 1 files, 48.0 MiB in " in stderr, stderr
        assert gets > 6  # 6 ranges of 8 MiB, and those the outage cut asked for again
    out = datamount("unmount", str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert not mounted(mp) and wait_for(lambda: not alive(pid))
    stats = mounts.stats("input", mp)
    assert stats["fs"]["read_errors"] == 0
    assert stats["cache"]["exhausted"] == 0
    assert stats["cache"]["retries"] >= RUNS  # each run's read waited out the outage
    assert stats["cache"]["outages"] == RUNS
    # One start and one end line per outage: of each download, of the daemon's policy.
    lines = outage_lines(tmp_path / "cache" / "logs" / "datamount-runtime.log")
    for who in ("download", "mount"):
        starts = [m for w, m in lines if w == who and m.startswith("storage unreachable since ")]
        ends = [m for w, m in lines if w == who and m.startswith("storage reachable again after ")]
        assert len(starts) == len(ends) == RUNS, (who, lines)
        assert all(m.endswith("failed: connection refused; retrying for up to 90 s") or
                   "connection reset" in m for m in starts), starts  # fmt: skip
    assert not any(azurite.key in m for _, m in lines)


def outage_lines(log: Path) -> list[tuple[str, str]]:
    """(download or mount, message) of the runtime log's WARNING lines of the
    retry policy (the download's threads are download_N, the daemon's others)."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split(" ", 4)
        if len(parts) == 5 and parts[1] == "WARNING" and parts[3] == "datamount.retry:":
            found.append(("download" if parts[2].startswith("download") else "mount", parts[4]))
    return found
