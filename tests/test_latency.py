"""Requests in flight follow the link's round trip (storage.latency): the
sizing rule, and a download and a ro_mount through a FaultProxy that holds
every request 25 ms, where the default thread count grows and an explicit
one is kept."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from datamount.storage.latency import MAX_IN_FLIGHT, PROBES, RTT_FLOOR_SECONDS, in_flight
from datamount.storage.memory import MemoryStore
from faultproxy import FaultProxy
from fuse_helpers import Mounts, datamount, mount_env, spec_file

FILES = {f"lat/f{i:03d}.bin": hashlib.sha256(str(i).encode()).digest() * 128 for i in range(96)}
DEFAULT = (os.cpu_count() or 1) * 4  # both thread defaults: cores x 4
slow_link_grows = pytest.mark.skipif(
    DEFAULT >= MAX_IN_FLIGHT, reason=f"a default of {DEFAULT} threads is already the cap"
)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("base", "rtt", "want"),
    [
        (8, 0.0005, 8),  # loopback: the default
        (8, RTT_FLOOR_SECONDS - 1e-4, 8),
        (8, 0.011, 30),  # 5 ms each way: 8 x (11 + 4) / 4
        (8, 0.041, MAX_IN_FLIGHT),  # 20 ms each way: the cap
        (128, 0.041, 128),  # never below the default of a large machine
    ],
)
def test_in_flight_follows_littles_law_within_its_bounds(base: int, rtt: float, want: int) -> None:
    assert in_flight(base, rtt) == want
    assert in_flight(base, rtt, cap=16) == max(base, min(16, want))  # a caller's own cap


@pytest.mark.unit
def test_a_local_store_is_no_link() -> None:
    from datamount.storage.latency import probe

    store = MemoryStore({"a": b"x"})
    assert probe(store, "a") < RTT_FLOOR_SECONDS
    assert probe(store, "missing/") < RTT_FLOOR_SECONDS  # not found is an answer too
    assert probe(store, "") < RTT_FLOOR_SECONDS  # the container's root
    assert store.requests["stat"] == 3 * PROBES


@pytest.mark.unit
def test_a_failure_other_than_not_found_is_the_works_own() -> None:
    """A refused credential is raised by the probe, as the download's listing
    would raise it: one error, before any work starts."""
    from datamount.errors import StorageError
    from datamount.storage.latency import probe

    class Refusing(MemoryStore):
        def stat(self, key: str) -> object:  # type: ignore[override]
            raise StorageError("AuthorizationFailure: no", transient=False)

    with pytest.raises(StorageError, match="AuthorizationFailure"):
        probe(Refusing(), "a")


@pytest.fixture
def slow_link(azurite, container, proxy: FaultProxy, tmp_path: Path) -> dict[str, str]:  # noqa: ANN001
    for name, data in FILES.items():
        container.upload_blob(name, data)
    via = SimpleNamespace(account=azurite.account, key=azurite.key, endpoint=proxy.endpoint)
    proxy.latency(0.025)
    proxy.reset()
    return mount_env(via, tmp_path, container.container_name)


def runtime_log(env: dict[str, str]) -> str:
    return (Path(env["DATAMOUNT_CACHE_DIR"]) / "logs" / "datamount-runtime.log").read_text()


@slow_link_grows
@pytest.mark.azurite
def test_a_download_over_a_slow_link_keeps_more_requests_in_flight(
    slow_link: dict[str, str], proxy: FaultProxy, tmp_path: Path
) -> None:
    dest = tmp_path / "dl"
    out = datamount("download", "azureml://datastores/store/paths/lat/", str(dest), env=slow_link)
    assert out.returncode == 0, out.stderr
    for name, data in FILES.items():
        assert (dest / name.removeprefix("lat/")).read_bytes() == data
    line = next(x for x in runtime_log(slow_link).splitlines() if "storage round trip" in x)
    assert "requests in flight (RSLEX_DOWNLOADER_THREADS unset; its default" in line
    sized = int(line.split(" ms: ")[1].split()[0])
    assert sized > DEFAULT
    assert DEFAULT < proxy.most_in_flight <= sized + 2  # + the listing and the probe's


@pytest.mark.azurite
def test_an_explicit_thread_count_is_kept_over_a_slow_link(
    slow_link: dict[str, str], proxy: FaultProxy, tmp_path: Path
) -> None:
    env = {**slow_link, "RSLEX_DOWNLOADER_THREADS": "4"}
    out = datamount("download", "azureml://datastores/store/paths/lat/", str(tmp_path / "dl"),
                    env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "storage round trip" not in runtime_log(env)
    assert proxy.most_in_flight <= 4


@slow_link_grows
@pytest.mark.azurite
@pytest.mark.fuse
def test_a_mount_over_a_slow_link_reads_ahead_with_more_threads(
    slow_link: dict[str, str], proxy: FaultProxy, tmp_path: Path, mounts: Mounts
) -> None:
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/lat/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=slow_link)
    assert out.returncode == 0, out.stderr
    line = next(x for x in runtime_log(slow_link).splitlines() if "storage round trip" in x)
    assert "(DATASET_MOUNT_READ_THREADS unset; its default" in line
    sized = int(line.split(" ms: ")[1].split()[0])
    assert sized > DEFAULT
    log = runtime_log(slow_link)
    assert f"{sized} read threads" in log  # the daemon's read path took the plan's count
    for name, data in sorted(FILES.items()):  # listing order: the file-ahead prefetch
        assert (mp / name.removeprefix("lat/")).read_bytes() == data
    assert proxy.most_in_flight > DEFAULT
    out = datamount("unmount", str(mp), env=slow_link)
    assert out.returncode == 0, out.stderr
