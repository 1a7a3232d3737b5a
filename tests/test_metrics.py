"""The Prometheus endpoint of a real ro_mount over Azurite (DATAMOUNT_METRICS_PORT),
`status --json`'s metrics_url, `status --watch` through a pipe, and the
one-line errors of a bad or taken port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fuse_helpers import EXE, Mounts, datamount, mount_env, spec_file, wait_for


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def mount_with_metrics(azurite, container, tmp_path: Path, mounts: Mounts, **extra: str):  # noqa: ANN001, ANN201
    env = mount_env(azurite, tmp_path, container.container_name,
                    DATAMOUNT_METRICS_PORT="0", **extra)  # fmt: skip
    mp = mounts.point(tmp_path / "mnt")
    spec = spec_file(tmp_path, "in", "uri_folder", "azureml://datastores/store/paths/ds/")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    return env, mp


def status_json(env: dict[str, str]) -> list[dict]:
    out = datamount("status", "--json", env=env)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.fuse
def test_a_mount_exports_its_counters_at_the_metrics_url(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:
    data = {"a.bin": os.urandom(5 << 20), "b.bin": os.urandom(300_000)}
    for name, body in data.items():
        container.upload_blob(f"ds/{name}", body)
    env, mp = mount_with_metrics(azurite, container, tmp_path, mounts)
    (entry,) = status_json(env)
    url = entry["metrics_url"]
    assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
    before = scrape(url)
    assert before[("datamount_storage_bytes_total", ())] == 0
    for name, body in data.items():
        assert (mp / name).read_bytes() == body

    # close(2) returns before the kernel's RELEASE reaches the daemon: wait for it
    assert wait_for(lambda: scrape(url)[("datamount_open_handles", ())] == 0)
    after = scrape(url)
    total = sum(len(b) for b in data.values())
    assert after[("datamount_storage_bytes_total", ())] == total
    assert after[("datamount_fuse_read_bytes_total", ())] == total
    reads = {labels: v for (name, labels), v in after.items()
             if name == "datamount_storage_requests_total" and ("op", "read") in labels}  # fmt: skip
    stats = mounts.stats("input", mp)  # written at mount time: counters at 0 then
    assert stats["cache"]["bytes_fetched"] == 0
    # Every ranged GET answered 206, and the histogram saw each one.
    assert reads == {
        (("op", "read"), ("status", "206")): reads[(("op", "read"), ("status", "206"))]
    }
    n = reads[(("op", "read"), ("status", "206"))]
    assert n >= 2
    assert after[("datamount_storage_request_seconds_count", (("kind", "read"),))] == n
    assert after[("datamount_cache_misses_total", ())] >= 2
    assert after[("datamount_open_handles", ())] == 0
    assert after[("datamount_memory_budget_bytes", (("area", "prefetch"),))] == 64 << 20
    assert after[("datamount_fuse_operations_total", (("op", "opens"),))] == 2
    # every FUSE callback is timed: the two opens, and the reads that returned the bytes
    assert after[("datamount_fuse_operation_seconds_count", (("op", "open"),))] == 2
    assert after[("datamount_fuse_operation_seconds_count", (("op", "read_into"),))] >= 2
    assert ("datamount_storage_throttled_total", ()) in after

    # A second read of a.bin (kernel page cache or the RAM tier): no new request.
    assert (mp / "a.bin").read_bytes() == data["a.bin"]
    again = scrape(url)
    assert again[("datamount_storage_bytes_total", ())] == total
    assert ("datamount_cache_hits_total", (("tier", "ram"),)) in again

    assert datamount("unmount", str(mp), env=env).returncode == 0
    assert status_json(env) == []


@pytest.mark.fuse
def test_status_watch_through_a_pipe_prints_one_line_per_mount_per_refresh(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:
    container.upload_blob("ds/a.bin", os.urandom(1 << 20))
    env, mp = mount_with_metrics(azurite, container, tmp_path, mounts)
    # SIGINT as at a terminal: a shell without job control starts a background
    # job (and so this suite, and its children) with SIGINT ignored.
    proc = subprocess.Popen([EXE, "status", "--watch", "0.2"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
    finally:
        proc.send_signal(2)  # Ctrl-C
        code = proc.wait(timeout=10)
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    for line in lines:
        assert f"{mp}: mount input, serving" in line and "metrics http://127.0.0.1:" in line
    assert datamount("unmount", str(mp), env=env).returncode == 0


@pytest.mark.slow
@pytest.mark.fuse
def test_status_shows_rates_and_the_verdict_after_an_interval(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:
    body = os.urandom(8 << 20)
    container.upload_blob("ds/a.bin", body)
    env, mp = mount_with_metrics(azurite, container, tmp_path, mounts)
    assert (mp / "a.bin").read_bytes() == body
    deadline = time.monotonic() + 20  # the daemon writes its stats every 5 s
    entry: dict = {}
    while time.monotonic() < deadline:
        (entry,) = status_json(env)
        if entry["rates"]:
            break
        time.sleep(0.5)
    assert set(entry["rates"]) >= {"storage_mb_s", "requests_s", "hit_ratio", "read_mb_s"}
    assert entry["verdict"]
    url = entry["metrics_url"]
    labels = [dict(k[1]) for k in scrape(url) if k[0] == "datamount_bottleneck"]
    assert len(labels) == 1 and labels[0]["verdict"]
    human = datamount("status", env=env).stdout
    assert "MB/s from storage" in human and "hit ratio" in human
    assert datamount("unmount", str(mp), env=env).returncode == 0


@pytest.mark.fuse
def test_a_bad_metrics_port_is_one_line_and_exit_2(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:
    env = mount_env(azurite, tmp_path, container.container_name, DATAMOUNT_METRICS_PORT="http")
    mp = mounts.point(tmp_path / "mnt")
    spec = spec_file(tmp_path, "in", "uri_folder", "azureml://datastores/store/paths/ds/")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "datamount: error: DATAMOUNT_METRICS_PORT='http': not an integer"
    ]


@pytest.mark.fuse
def test_a_taken_metrics_port_is_one_clear_line_and_exit_3(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:
    container.upload_blob("ds/a.bin", b"x")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = mount_env(azurite, tmp_path, container.container_name,
                        DATAMOUNT_METRICS_PORT=str(port))  # fmt: skip
        mp = mounts.point(tmp_path / "mnt")
        spec = spec_file(tmp_path, "in", "uri_folder", "azureml://datastores/store/paths/ds/")
        out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 3, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"metrics endpoint 127.0.0.1:{port}" in lines[0]
    assert "already in use" in lines[0]
    assert status_json(env) == []


@pytest.mark.unit
def test_a_transfer_serves_its_progress_as_metrics() -> None:
    from datamount.transfer.progress import Progress

    with Progress("download", metrics=("127.0.0.1", 0)) as progress:
        progress.planned(2, 3000)
        progress.add_bytes(1000)
        progress.file_done()
        got = scrape(progress.metrics_url)
        assert got[("datamount_download_bytes_total", ())] == 1000
        assert got[("datamount_download_files_total", ())] == 1
        assert got[("datamount_download_planned_bytes", ())] == 3000
        url = progress.metrics_url
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_the_download_command_serves_metrics_and_names_their_url(
    azurite, container, tmp_path: Path
) -> None:  # noqa: ANN001
    container.upload_blob("ds/a.bin", b"x" * 5000)
    env = mount_env(azurite, tmp_path, container.container_name, DATAMOUNT_METRICS_PORT="0")
    dest = tmp_path / "dest"
    out = datamount("download", "azureml://datastores/store/paths/ds/", str(dest), env=env)
    assert out.returncode == 0, out.stderr
    assert "datamount: download metrics at http://127.0.0.1:" in out.stderr
    assert (dest / "a.bin").read_bytes() == b"x" * 5000
    with socket.socket() as taken:  # a taken port: one line, exit 3, nothing downloaded
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env["DATAMOUNT_METRICS_PORT"] = str(taken.getsockname()[1])
        out = datamount("download", "azureml://datastores/store/paths/ds/", str(tmp_path / "d2"),
                        env=env)  # fmt: skip
    assert out.returncode == 3, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "already in use" in out.stderr
    assert not (tmp_path / "d2" / "a.bin").exists()
