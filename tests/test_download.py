"""The Downloader against real Azurite (and a MemoryStore for fault plans):
every byte equals the source, no partial file under a final name, resumable,
pinned to one version, refused before writing when the disk is short."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import store_on
from datamount.errors import AccessDenied, DataError, ObjectNotFound, VersionChanged
from datamount.storage import ObjectStore
from datamount.storage.memory import MemoryStore
from datamount.storage.retry import RetryPolicy
from datamount.transfer.copyplan import SPAN_RANGES, NotEnoughSpace, span_ranges
from datamount.transfer.downloader import Downloader, DownloadOptions
from datamount.transfer.manifest import MANIFEST_NAME
from faults import FaultPlan, FaultyStore, connection_reset, forbidden, throttled
from fuse_helpers import mount_env as cli_env

RANGE = 64 * 1024  # small ranges: multi-range files stay small
rng = random.Random(11)


def data(n: int) -> bytes:
    return rng.randbytes(n)


AWKWARD = {
    "empty.bin": b"",
    "one-range.bin": data(RANGE),
    "one-byte-over.bin": data(RANGE + 1),
    "several/ranges.bin": data(5 * RANGE + 123),
    "small.txt": b"hello\n",
    "dir with space/naïve 日本.txt": data(1000),
    "hash#tag/50%off.dat": data(777),
    "a/b/c/d/e/f/g/h/deep.bin": data(4096),
    "folder/": b"",  # a folder marker: becomes nothing
}


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def tree(root: Path) -> dict[str, str]:
    """rel path → sha256 of every regular file, datamount's manifest excluded."""
    out = {}
    for path in root.rglob("*"):
        if path.is_file() and path.name != MANIFEST_NAME:
            out[path.relative_to(root).as_posix()] = sha(path.read_bytes())
    return out


def expected(blobs: dict[str, bytes], prefix: str = "") -> dict[str, str]:
    return {
        k[len(prefix) :]: sha(v)
        for k, v in blobs.items()
        if k.startswith(prefix) and not k.endswith("/")
    }


def no_parts(root: Path) -> bool:
    return not [p for p in root.rglob("*.part")]


def options(**kw: object) -> DownloadOptions:
    base = {"threads": 4, "range_size": RANGE, "reserved_free_disk_space": 0}
    return DownloadOptions(**{**base, **kw})  # type: ignore[arg-type]


def fast_retry(n: int = 3) -> RetryPolicy:
    return RetryPolicy(retries=n, sleep=lambda s: None)


class Counting:
    """Counts read_into calls per key on any store (the request count of a download)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.reads: Counter[str] = Counter()

    def read_into(self, key: str, offset: int, buf: memoryview, *, etag: str | None = None) -> int:
        self.reads[key] += 1
        return self.inner.read_into(key, offset, buf, etag=etag)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_awkward_tree_from_azurite(azurite, container, azure_store, tmp_path: Path) -> None:  # noqa: ANN001
    blobs = {f"ds/{k}": v for k, v in AWKWARD.items()}
    azurite.seed(container, blobs)
    dest = tmp_path / "out"
    result = Downloader(azure_store, options()).download("ds", dest, is_file=False, source_id="t")
    assert tree(dest) == expected(blobs, "ds/")
    assert (dest / "empty.bin").stat().st_size == 0
    assert result.files == len(expected(blobs, "ds/"))
    assert result.bytes == sum(len(v) for k, v in blobs.items())
    assert no_parts(dest)
    assert (dest / MANIFEST_NAME).exists()


def test_uri_file_lands_under_its_name(azurite, container, azure_store, tmp_path: Path) -> None:  # noqa: ANN001
    body = data(3 * RANGE + 5)
    azurite.seed(container, {"x/y/model weights.bin": body})
    result = Downloader(azure_store, options()).download(
        "x/y/model weights.bin", tmp_path / "d", is_file=True, source_id="t"
    )
    assert result.path == tmp_path / "d" / "model weights.bin"
    assert result.path.read_bytes() == body


@pytest.mark.slow
def test_listing_over_5000_files_crosses_pages(azurite, many_blobs, tmp_path: Path) -> None:  # noqa: ANN001
    name, blobs = many_blobs
    store = store_on(azurite, name)
    assert len(list(store.list_pages("many/"))) == 2
    dest = tmp_path / "many"
    result = Downloader(store, options(threads=16)).download(
        "many/", dest, is_file=False, source_id="t"
    )
    assert result.files == 5003
    assert tree(dest) == expected(blobs, "many/")


def test_missing_folder_and_file(azure_store, tmp_path: Path) -> None:  # noqa: ANN001
    with pytest.raises(ObjectNotFound):
        Downloader(azure_store, options()).download(
            "nope/", tmp_path / "a", is_file=False, source_id="t"
        )
    with pytest.raises(ObjectNotFound):
        Downloader(azure_store, options()).download(
            "nope.bin", tmp_path / "b", is_file=True, source_id="t"
        )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.unit
def test_transient_faults_are_retried(tmp_path: Path) -> None:
    blobs = {f"f{i}.bin": data(3 * RANGE + i) for i in range(6)}
    inner = MemoryStore(blobs)
    plan = (
        FaultPlan()
        .fail("read", times=3, error=throttled(0.0))
        .fail("read", times=2, error=connection_reset())
    )
    retry = fast_retry(5)
    store = FaultyStore(inner, plan, retry=retry)
    Downloader(store, options()).download("", tmp_path, is_file=False, source_id="t")
    assert tree(tmp_path) == expected(blobs)
    assert retry.stats.retries == 5
    assert no_parts(tmp_path)


@pytest.mark.unit
def test_permanent_403_fails_cleanly(tmp_path: Path) -> None:
    blobs = {f"f{i}.bin": data(4 * RANGE) for i in range(8)}
    plan = FaultPlan().fail("read", times=None, error=forbidden(), key="f5.bin")
    retry = fast_retry()
    store = FaultyStore(MemoryStore(blobs), plan, retry=retry)
    with pytest.raises(AccessDenied):
        Downloader(store, options(threads=2)).download("", tmp_path, is_file=False, source_id="t")
    assert retry.stats.retries == 0  # permanent: never retried
    assert not (tmp_path / "f5.bin").exists()
    assert no_parts(tmp_path)
    for path in tmp_path.glob("f*.bin"):  # whatever finished is whole
        assert path.read_bytes() == blobs[path.name]


class OverwriteOnFirstRead:
    """Replace the blob through the SDK right before the first read: the read
    pinned to the listed etag must fail and the file restart on the new version."""

    def __init__(self, inner: ObjectStore, container, key: str, new: bytes) -> None:  # noqa: ANN001
        self.inner, self.container, self.key, self.new = inner, container, key, new
        self.done = False
        self.stale = 0

    def read_into(self, key: str, offset: int, buf: memoryview, *, etag: str | None = None) -> int:
        if key == self.key and not self.done:
            self.done = True
            self.container.upload_blob(key, self.new, overwrite=True)
        try:
            return self.inner.read_into(key, offset, buf, etag=etag)
        except VersionChanged:
            self.stale += 1
            raise

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_blob_overwritten_mid_download_is_one_version(
    azurite, container, azure_store, tmp_path: Path
) -> None:  # noqa: ANN001
    old, new = data(6 * RANGE), data(4 * RANGE + 9)
    azurite.seed(container, {"v/file.bin": old, "v/other.bin": b"x"})
    store = OverwriteOnFirstRead(azure_store, container, "v/file.bin", new)
    result = Downloader(store, options(threads=3)).download(
        "v/", tmp_path, is_file=False, source_id="t"
    )  # type: ignore[arg-type]
    assert store.stale >= 1
    assert result.restarts == 1
    assert (tmp_path / "file.bin").read_bytes() == new
    assert no_parts(tmp_path)


class OverwriteOnEveryRead:
    """A blob rewritten before every read of it: no version lasts a download."""

    def __init__(self, inner: MemoryStore, key: str) -> None:
        self.inner, self.key, self.writes = inner, key, 0

    def read_into(self, key: str, offset: int, buf: memoryview, *, etag: str | None = None) -> int:
        if key == self.key:
            self.writes += 1
            self.inner.put(key, data(RANGE + self.writes))
        return self.inner.read_into(key, offset, buf, etag=etag)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


@pytest.mark.unit
def test_a_blob_that_never_stops_changing_is_a_data_error_and_leaves_no_part(
    tmp_path: Path,
) -> None:
    inner = MemoryStore({"v/hot.bin": data(RANGE), "v/calm.bin": b"calm"})
    store = OverwriteOnEveryRead(inner, "v/hot.bin")
    with pytest.raises(DataError) as caught:
        Downloader(store, options(threads=2)).download(  # type: ignore[arg-type]
            "v/", tmp_path / "dest", is_file=False, source_id="t"
        )
    assert caught.value.exit_code == 3
    assert str(caught.value).startswith("v/hot.bin: changed ")
    assert "times during the download; giving up" in str(caught.value)
    assert no_parts(tmp_path / "dest") and not (tmp_path / "dest" / "hot.bin").exists()


@pytest.mark.unit
def test_resume_skips_complete_files(tmp_path: Path) -> None:
    blobs = {f"d/f{i:02d}.bin": data(RANGE // 2) for i in range(20)}
    inner = MemoryStore(blobs)
    # First run dies on f12 (a crash stand-in: completed files stay recorded).
    plan = FaultPlan().fail("read", times=None, error=forbidden(), key="d/f12.bin")
    with pytest.raises(AccessDenied):
        Downloader(FaultyStore(inner, plan), options(threads=1)).download(
            "d/", tmp_path, is_file=False, source_id="src"
        )
    done_first = {p.name for p in tmp_path.glob("f*.bin")}
    assert done_first and len(done_first) < 20
    counting = Counting(inner)
    result = Downloader(counting, options(threads=2)).download(
        "d/", tmp_path, is_file=False, source_id="src"
    )  # type: ignore[arg-type]
    assert result.skipped_files == len(done_first)
    assert set(counting.reads) == {
        f"d/{n}" for n in {f"f{i:02d}.bin" for i in range(20)} - done_first
    }
    assert tree(tmp_path) == expected(blobs, "d/")
    # A changed blob is fetched again; the others are not.
    inner.put("d/f03.bin", b"new content")
    again = Counting(inner)
    Downloader(again, options()).download("d/", tmp_path, is_file=False, source_id="src")  # type: ignore[arg-type]
    assert dict(again.reads) == {"d/f03.bin": 1}
    assert (tmp_path / "f03.bin").read_bytes() == b"new content"
    # --overwrite copies everything again.
    forced = Counting(inner)
    Downloader(forced, options(overwrite=True)).download(
        "d/", tmp_path, is_file=False, source_id="src"
    )  # type: ignore[arg-type]
    assert sum(forced.reads.values()) == 20


@pytest.mark.unit
def test_not_enough_disk_refused_before_writing(tmp_path: Path) -> None:
    store = MemoryStore({"a.bin": data(1000), "b.bin": data(2000)})
    dest = tmp_path / "dest"
    huge = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    with pytest.raises(NotEnoughSpace) as info:
        Downloader(store, options(reserved_free_disk_space=huge)).download(
            "", dest, is_file=False, source_id="t"
        )
    message = str(info.value)
    assert message.startswith(f"not enough disk space in {dest}: need 2.9 KiB plus ")
    assert "reserved (DATASET_RESERVED_FREE_DISK_SPACE)" in message and "free" in message
    assert not dest.exists()
    assert store.requests["read"] == 0
    assert isinstance(info.value, DataError)


@pytest.mark.unit
def test_unsafe_names_are_refused(tmp_path: Path) -> None:
    store = MemoryStore({"d/ok.bin": b"1", "d/../escape.bin": b"2"})
    with pytest.raises(DataError, match="cannot be a local path"):
        Downloader(store, options()).download("d/", tmp_path / "o", is_file=False, source_id="t")
    assert not (tmp_path / "escape.bin").exists()


def test_two_objects_landing_at_one_path_never_race(
    azurite,
    container,
    azure_store,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,  # noqa: ANN001
) -> None:
    """'a//b' collapses to 'a/b': with a real 'a/b' beside it, the first listed
    wins, the other is skipped with a warning naming it, and the rest lands.
    (It was two jobs racing for one .part: an unexpected FileNotFoundError.)"""
    blobs = {"d/a//b": b"double", "d/a/b": b"single", "d/a/c": b"c", "d/x//y": b"lone"}
    for name, body in blobs.items():
        container.upload_blob(name, body)
    result = Downloader(azure_store, options()).download(
        "d/", tmp_path / "o", is_file=False, source_id="t"
    )
    out = tmp_path / "o"
    assert (out / "a/b").read_bytes() == b"double"  # 'd/a//b' sorts first
    assert (out / "a/c").read_bytes() == b"c"
    assert (out / "x/y").read_bytes() == b"lone"  # alone, a doubled slash just collapses
    assert result.files == 3 and no_parts(out)
    assert "d/a/b: skipped: another object already lands at" in caplog.text


@pytest.mark.unit
def test_memory_is_bounded_by_threads_not_data(tmp_path: Path) -> None:
    """Buffers are per worker thread: 20 files × 8 ranges reuse `threads` buffers."""
    blobs = {f"f{i}.bin": data(8 * RANGE) for i in range(20)}
    downloader = Downloader(MemoryStore(blobs), options(threads=3))
    made = []
    original = downloader._buffers.get

    def spy() -> memoryview:
        buf = original()
        if all(buf.obj is not b.obj for b in made):
            made.append(buf)
        return buf

    downloader._buffers.get = spy  # type: ignore[method-assign]
    downloader.download("", tmp_path, is_file=False, source_id="t")
    assert tree(tmp_path) == expected(blobs)
    assert 1 <= len(made) <= 3


# -- the CLI, as a job runs it ----------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def datamount(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = str(Path(sys.executable).parent / "datamount")
    return subprocess.run(
        [exe, *args], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_cli_download_and_mount_download_mode(azurite, container, tmp_path: Path) -> None:  # noqa: ANN001
    blobs = {"cli/a.txt": b"alpha", "cli/sub/b.bin": data(300_000)}
    azurite.seed(container, blobs)
    env = cli_env(azurite, tmp_path, container.container_name)
    out = datamount(
        "download", "azureml://datastores/store/paths/cli/", str(tmp_path / "d"), env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{tmp_path / 'd'}\n"
    assert tree(tmp_path / "d") == expected(blobs, "cli/")
    assert "downloaded 2 files" in out.stderr
    # uri_file through a spec in download mode: `mount` returns the file's path.
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "type: uri_file\npath: azureml://datastores/store/paths/cli/sub/b.bin\nmode: download\n"
    )
    out = datamount("mount", str(spec), str(tmp_path / "m"), env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{tmp_path / 'm' / 'b.bin'}\n"
    assert (tmp_path / "m" / "b.bin").read_bytes() == blobs["cli/sub/b.bin"]
    capability = (tmp_path / "cache" / "logs" / "data-capability.log").read_text()
    assert "ActivityStarted, download" in capability
    assert "ActivityCompleted: Activity=download, HowEnded=Success, Duration=" in capability
    runtime = (tmp_path / "cache" / "logs" / "datamount-runtime.log").read_text()
    assert "downloaded http://" in runtime and "threads" in runtime and "retries" in runtime
    assert azurite.key not in runtime + capability


def test_cli_errors_are_one_line(azurite, container, tmp_path: Path) -> None:  # noqa: ANN001
    env = cli_env(azurite, tmp_path, container.container_name)
    out = datamount(
        "download", "azureml://datastores/store/paths/missing/", str(tmp_path / "d"), env=env
    )
    assert out.returncode == 3
    assert out.stderr.startswith("datamount: error: download of http://")
    assert len(out.stderr.splitlines()) == 1
    env["TEST_KEY"] = "d3Jvbmcta2V5LXdyb25nLWtleQ=="
    azurite.seed(container, {"k/x.bin": b"x"})
    out = datamount("download", "azureml://datastores/store/paths/k/", str(tmp_path / "e"), env=env)
    assert out.returncode == 3
    assert "403" in out.stderr or "denied" in out.stderr.lower()
    assert "d3Jvbmcta2V5" not in out.stderr
    assert not (tmp_path / "e" / "x.bin").exists()
    env2 = cli_env(azurite, tmp_path, container.container_name)
    env2["DATASET_RESERVED_FREE_DISK_SPACE"] = "1000000GB"
    out = datamount(
        "download", "azureml://datastores/store/paths/k/", str(tmp_path / "f"), env=env2
    )
    assert out.returncode == 3
    assert "not enough disk space" in out.stderr
    assert not (tmp_path / "f").exists()


def test_killed_download_resumes(azurite, container, tmp_path: Path) -> None:  # noqa: ANN001
    """SIGKILL mid-download, then the same command: only the rest is fetched."""
    blobs = {f"kill/{i:03d}.bin": data(40_000) for i in range(300)}
    azurite.seed(container, blobs, threads=32)
    env = cli_env(azurite, tmp_path, container.container_name)
    env["RSLEX_DOWNLOADER_THREADS"] = "1"
    dest = tmp_path / "k"
    exe = str(Path(sys.executable).parent / "datamount")
    proc = subprocess.Popen(
        [exe, "download", "azureml://datastores/store/paths/kill/", str(dest)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    manifests = tmp_path / "cache" / "manifests"  # the CLI keeps it out of DEST
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = list(manifests.glob("*.jsonl"))
        if found and found[0].read_text().count("\n") > 30:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = {p.name for p in dest.glob("*.bin")}
    assert 30 <= len(done) < 300, len(done)
    store = Counting(store_on(azurite, container.container_name))
    source_id = f"{azurite.endpoint}/{container.container_name}/kill/"
    result = Downloader(store, options(manifest_dir=manifests)).download(
        "kill/", dest, is_file=False, source_id=source_id
    )  # type: ignore[arg-type]
    assert result.skipped_files >= len(done) - 1  # the file being renamed at the kill may redo
    assert sum(store.reads.values()) == 300 - result.skipped_files
    assert tree(dest) == expected(blobs, "kill/")
    assert no_parts(dest)


@pytest.mark.unit
def test_tmpfs_destination_falls_back_to_buffered_writes(tmp_path: Path) -> None:
    """tmpfs refuses O_DIRECT: the download still completes, byte for byte."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    import tempfile

    blobs = {"aligned.bin": data(4 * RANGE), "odd.bin": data(3 * RANGE + 5)}
    with tempfile.TemporaryDirectory(dir=shm) as dest:
        Downloader(MemoryStore(blobs), options()).download(
            "", Path(dest), is_file=False, source_id="t"
        )
        assert tree(Path(dest)) == expected(blobs)


@pytest.mark.unit
def test_small_files_are_fsynced_in_groups_before_their_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: every file is fsync'd before it gets its final name, in
    groups of GROUP_COMMIT_FILES; a file above GROUP_COMMIT_MAX_FILE alone."""
    import datamount.transfer.durable as durable
    import datamount.transfer.landing as landing_module

    monkeypatch.setattr(durable, "syncfs", lambda: None)  # the fallback: a kernel < 5.8
    monkeypatch.setattr(landing_module, "GROUP_COMMIT_FILES", 8)
    monkeypatch.setattr(landing_module, "GROUP_COMMIT_MAX_FILE", 2 * RANGE)
    blobs = {f"s/f{i:02d}.bin": data(1000 + i) for i in range(21)}
    blobs["s/big.bin"] = data(3 * RANGE)
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
        events.append(("rename", os.path.basename(src)))
        real_replace(src, dst)

    monkeypatch.setattr(landing_module.os, "fsync", fsync)
    monkeypatch.setattr(landing_module.os, "replace", replace)
    Downloader(MemoryStore(blobs), options(threads=4)).download(
        "s/", tmp_path, is_file=False, source_id="t"
    )
    assert tree(tmp_path) == expected(blobs, "s/")
    parts = [name for kind, name in events if kind == "fsync" and name.endswith(".part")]
    assert sorted(parts) == sorted(f".{name[2:]}.part" for name in blobs)  # each once
    for index, (kind, name) in enumerate(events):
        if kind == "rename" and name.endswith(".part"):
            assert ("fsync", name) in events[:index], f"{name} renamed before its fsync"
    # Small files commit in groups: the first small rename follows 8 small fsyncs.
    first = next(i for i, (k, n) in enumerate(events) if k == "rename" and n.startswith(".f"))
    assert sum(1 for k, n in events[:first] if k == "fsync" and n.startswith(".f")) == 8


@pytest.mark.unit
def test_small_file_groups_are_made_durable_by_one_syncfs_before_their_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With syncfs (Linux >= 5.8): one syncfs of DEST's filesystem per group
    of GROUP_COMMIT_FILES small files, before any of their renames, and no
    fsync of a small file; a file above GROUP_COMMIT_MAX_FILE is fsync'd alone."""
    import datamount.transfer.durable as durable
    import datamount.transfer.landing as landing_module

    real_syncfs = durable.syncfs()
    if real_syncfs is None:
        pytest.skip("no syncfs that reports write-back errors here")
    monkeypatch.setattr(landing_module, "GROUP_COMMIT_FILES", 8)
    monkeypatch.setattr(landing_module, "GROUP_COMMIT_MAX_FILE", 2 * RANGE)
    blobs = {f"s/f{i:02d}.bin": data(1000 + i) for i in range(21)}
    blobs["s/big.bin"] = data(3 * RANGE)
    events: list[tuple[str, str]] = []
    real_fsync, real_replace, real_pwrite = os.fsync, os.replace, os.pwrite

    def syncfs(fd: int) -> int:
        events.append(("syncfs", os.readlink(f"/proc/self/fd/{fd}")))
        return real_syncfs(fd)

    def fsync(fd: int) -> None:
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
        events.append(("rename", os.path.basename(src)))
        real_replace(src, dst)

    def pwrite(fd: int, view: memoryview, offset: int) -> int:
        events.append(("write", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_pwrite(fd, view, offset)

    monkeypatch.setattr(durable, "syncfs", lambda: syncfs)
    monkeypatch.setattr(landing_module.os, "pwrite", pwrite)
    monkeypatch.setattr(landing_module.os, "fsync", fsync)
    monkeypatch.setattr(landing_module.os, "replace", replace)
    Downloader(MemoryStore(blobs), options(threads=4)).download(
        "s/", tmp_path, is_file=False, source_id="t"
    )
    assert tree(tmp_path) == expected(blobs, "s/")
    assert [n for k, n in events if k == "fsync" and n.endswith(".part")] == [".big.bin.part"]
    assert {n for k, n in events if k == "syncfs"} == {str(tmp_path)}
    # 21 small files in groups of up to 8: 3 full-group commits, plus one when every
    # file in flight waits for a commit (timing decides whether that happens once more)
    assert 1 < sum(1 for k, _ in events if k == "syncfs") <= 21 // 4
    last_write: dict[str, int] = {}
    for index, (kind, name) in enumerate(events):
        if kind == "write":
            last_write[name] = index
        elif kind == "rename" and name.startswith(".f"):
            synced = [i for i, (k, _) in enumerate(events[:index]) if k == "syncfs"]
            assert synced and synced[-1] > last_write[name], f"{name} renamed before a syncfs"


@pytest.mark.unit
def test_a_folder_shadows_a_blob_of_the_same_name(tmp_path: Path) -> None:
    """Blobs 'x' and 'x/y' cannot both land on disk: the folder wins (as in
    the mount), the rest of the download completes."""
    blobs = {"c/x": b"file", "c/x-1": b"a", "c/x/y": b"y", "c/x/z/w": b"w", "c/z": b"z"}
    result = Downloader(MemoryStore(blobs, page_size=2), options()).download(
        "c/", tmp_path, is_file=False, source_id="t"
    )
    assert tree(tmp_path) == expected({k: v for k, v in blobs.items() if k != "c/x"}, "c/")
    assert result.files == 4


def test_big_files_come_in_spans(azurite, container, azure_store, tmp_path: Path) -> None:  # noqa: ANN001
    """A file with at least two spans per thread: one GET per span of up to
    SPAN_RANGES ranges, read through the range-size buffer; smaller files:
    one GET per range, as before."""
    blobs = {"s/big.bin": data(32 * RANGE + 7), "s/small.bin": data(3 * RANGE + 5)}
    azurite.seed(container, blobs)
    gets: list[str] = []

    def hook(method: str, path: str, headers: dict[str, str], status: int) -> None:
        if method == "GET" and "x-ms-range" in headers:
            gets.append(path.rsplit("/", 1)[-1])

    azure_store.raw.hooks.append(hook)
    downloader = Downloader(azure_store, options(threads=2))
    downloader.download("s", tmp_path, is_file=False, source_id="t")
    assert tree(tmp_path) == expected(blobs, "s/")
    assert no_parts(tmp_path)
    # 32 ranges + 7 bytes, 2 threads: spans of 8 ranges -> 5 GETs (the last 7 bytes)
    assert Counter(gets) == {"big.bin": 5, "small.bin": 4}
    assert downloader.progress.bytes == sum(len(v) for v in blobs.values())


@pytest.mark.unit
def test_span_ranges_keep_two_spans_per_thread() -> None:
    r = 8 << 20
    assert span_ranges(1 << 30, r, 8) == SPAN_RANGES == 8  # 1 GiB: 16 GETs of 64 MiB
    assert span_ranges(256 << 20, r, 8) == 2  # 16 GETs of 16 MiB
    assert span_ranges(100 << 20, r, 8) == 1  # a GET per range
    assert span_ranges(0, r, 8) == 1
