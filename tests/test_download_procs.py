"""The download's small-file lane in worker processes (DATAMOUNT_DOWNLOAD_PROCESSES,
transfer.processlane) against real Azurite, through a FaultProxy that sees every
process's requests: bytes equal, one GET per small file, resumable, a worker's
error or death is one clear error with no partial file under a final name, and
the account key reaches a worker over its pipe only."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import seeded_stores
from datamount.errors import AccessDenied, DataError, SettingsError
from datamount.settings import Settings
from datamount.storage import ObjectStore
from datamount.storage.memory import MemoryStore
from datamount.transfer.downloader import Downloader, DownloadOptions
from datamount.transfer.manifest import MANIFEST_NAME

RANGE = 64 * 1024
rng = random.Random(16)


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): sha(p.read_bytes())
        for p in root.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME
    }


def parts(root: Path) -> list[Path]:
    return list(root.rglob("*.part"))


def options(**kw: object) -> DownloadOptions:
    base = {"threads": 4, "range_size": RANGE, "reserved_free_disk_space": 0, "processes": 2}
    return DownloadOptions(**{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture
def seeded(azurite, container, proxy) -> Iterator[Callable[[dict[str, bytes]], ObjectStore]]:  # noqa: ANN001
    """`seeded(blobs)`: `blobs` uploaded to the test's container, and a store
    on it through the proxy (which sees every process's requests), closed
    at the end of the test."""
    yield from seeded_stores(azurite, container, proxy.endpoint, retries=2)


def small_tree(prefix: str, n: int) -> dict[str, bytes]:
    sizes = [1, 777, 4096, RANGE, RANGE - 1, 3 * 4096]  # O_DIRECT-aligned and not
    return {
        f"{prefix}/d{i % 3}/f{i:03}.bin": rng.randbytes(sizes[i % len(sizes)]) for i in range(n)
    }


def gets(proxy, blob: str) -> int:  # noqa: ANN001
    return len(proxy.ranged_gets(blob))


def test_worker_processes_download_every_byte_one_get_per_small_file(
    seeded,
    proxy,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    blobs = small_tree("lane", 30)
    blobs["lane/empty.bin"] = b""
    blobs["lane/big/ranges.bin"] = rng.randbytes(5 * RANGE + 1)  # stays in-process, 6 ranges
    store = seeded(blobs)
    proxy.reset()
    downloader = Downloader(store, options())
    result = downloader.download("lane", tmp_path / "out", is_file=False, source_id="s")
    assert downloader._lane is not None and len(downloader._lane.pids) == 2
    want = {k[len("lane/") :]: sha(v) for k, v in blobs.items()}
    assert tree(tmp_path / "out") == want
    assert not parts(tmp_path / "out")
    assert (result.files, result.bytes) == (32, sum(map(len, blobs.values())))
    for name, body in blobs.items():
        expected = 0 if not body else -(-len(body) // RANGE)
        assert gets(proxy, name) == expected, name
    # The manifest the parent kept: a re-run skips every file, fetches nothing.
    proxy.reset()
    again = Downloader(store, options()).download(
        "lane", tmp_path / "out", is_file=False, source_id="s"
    )
    assert (again.files, again.skipped_files) == (0, 32)
    assert not proxy.ranged_gets()


def test_a_workers_storage_error_keeps_its_class_and_leaves_no_part(
    seeded,
    proxy,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    blobs = small_tree("deny", 12)
    store = seeded(blobs)
    denied = "deny/d1/f004.bin"
    proxy.deny(denied)
    try:
        with pytest.raises(AccessDenied, match="f004.bin"):
            Downloader(store, options()).download(
                "deny", tmp_path / "out", is_file=False, source_id="s"
            )
        out = tmp_path / "out"
        assert not parts(out)
        assert not (out / "d1" / "f004.bin").exists()
        for rel, digest in tree(out).items():  # what was committed is whole
            assert digest == sha(blobs[f"deny/{rel}"])
    finally:
        proxy.allow(denied)


def _lane_pids(downloader: Downloader, deadline: float) -> list[int]:
    while time.monotonic() < deadline:
        lane = downloader._lane
        if lane is not None and lane.pids:
            return lane.pids
        time.sleep(0.001)
    raise AssertionError("the worker processes never started")


def test_a_killed_worker_is_one_clear_error_and_no_partial_file(
    seeded,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    blobs = small_tree("kill", 300)
    downloader = Downloader(seeded(blobs), options())
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            downloader.download("kill", tmp_path / "out", is_file=False, source_id="s")
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    victim = _lane_pids(downloader, time.monotonic() + 30)[0]
    os.kill(victim, signal.SIGKILL)
    thread.join(60)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], DataError), outcome
    assert f"download worker process {victim} was killed by signal SIGKILL" in str(outcome[0])
    out = tmp_path / "out"
    assert not parts(out)
    for rel, digest in tree(out).items():  # files committed before the death are whole
        assert digest == sha(blobs[f"kill/{rel}"])
    for pid in downloader._lane.pids if downloader._lane else []:
        assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_the_account_key_is_in_no_workers_argv_or_environment(
    azurite,
    seeded,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    key = azurite.key.encode()
    if any(key in v.encode() for v in os.environ.values()):
        pytest.skip("the test's own environment holds the key")
    blobs = small_tree("secret", 300)
    downloader = Downloader(seeded(blobs), options())
    thread = threading.Thread(
        target=downloader.download,
        args=("secret", tmp_path / "out"),
        kwargs={"is_file": False, "source_id": "s"},
    )
    thread.start()
    seen = 0
    try:
        for pid in _lane_pids(downloader, time.monotonic() + 30):
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            for one in (pid, parent):  # the worker, and the forkserver that forked it
                try:
                    cmdline = Path(f"/proc/{one}/cmdline").read_bytes()
                    environ = Path(f"/proc/{one}/environ").read_bytes()
                except OSError:  # it finished already
                    continue
                assert key not in cmdline and key not in environ
                seen += 1
    finally:
        thread.join(60)
    assert seen >= 1
    assert tree(tmp_path / "out") == {k[len("secret/") :]: sha(v) for k, v in blobs.items()}


@pytest.mark.unit
def test_a_store_no_worker_can_open_stays_in_process(tmp_path: Path, caplog) -> None:  # noqa: ANN001
    store = MemoryStore()
    store.put("m/a.bin", b"a" * 1000)
    store.put("m/b.bin", b"b" * 3)
    caplog.set_level("INFO", logger="datamount.transfer.download")
    downloader = Downloader(store, options(processes=4))
    downloader.download("m", tmp_path / "out", is_file=False, source_id="s")
    assert downloader._lane is None
    assert (tmp_path / "out" / "a.bin").read_bytes() == b"a" * 1000
    assert "cannot be opened in a worker process" in caplog.text


@pytest.mark.unit
def test_the_knob() -> None:
    assert Settings.from_env({}).download_processes == 1
    assert Settings.from_env({"DATAMOUNT_DOWNLOAD_PROCESSES": "4"}).download_processes == 4
    with pytest.raises(SettingsError, match="DATAMOUNT_DOWNLOAD_PROCESSES"):
        Settings.from_env({"DATAMOUNT_DOWNLOAD_PROCESSES": "0"})
